"""Where a run goes: one `Place` interface (base.py), one folder per place holding all that is its own (local/, ssh/,
slurm/, vast/), found by name through one table (registry.py), the only module that imports a place's folder."""
