"""What a run on hosts ships (decided with its plan) and shipping it: the code and the image."""
