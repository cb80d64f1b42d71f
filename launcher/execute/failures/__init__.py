"""Which failure ended a run or an attempt, and what of the failing rank's own log to show."""
