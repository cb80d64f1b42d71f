"""What a run leaves behind: its run directory records, progress display, reports, plots and sweeps."""
