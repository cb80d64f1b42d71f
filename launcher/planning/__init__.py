"""The pure plan of a run and the read-only probe of hosts that feeds it."""
