"""Carrying a plan out on the machines a provider gives, whatever the place: up.py's sequence, the run on hosts
over SSH (hosts/) or on this machine (this_machine/), what is shipped (ship/), following it (following/), which
failure ended it (failures/), and the commands on a recorded run (day2/). No module here imports a place."""
