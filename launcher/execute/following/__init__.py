"""Following a live run from `up`: its progress and rank 0's output, hangs and stalls, interruptions and lost contact,
each told in one line."""
