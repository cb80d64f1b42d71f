"""Carrying a plan out: on this machine, on hosts over SSH, and reattaching to a run that is under way."""
