"""What to run: the run spec, torchrun's argv, presets, data sets and hosts as the user typed them."""
