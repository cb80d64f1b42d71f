"""Where a run goes: one `Place` interface (base.py) per place (this machine, SSH hosts, Slurm, Vast.ai), found by
name through one table (registry.py); each place's module adapts the executor's and provider's own functions."""
