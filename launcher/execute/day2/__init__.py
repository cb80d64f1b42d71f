"""The commands on a recorded run (`status`, `logs`, `pull`, `down`, `stacks`), rebuilt from its run directory alone."""
