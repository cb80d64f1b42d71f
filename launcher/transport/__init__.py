"""Reaching hosts: SSH connections, verified host keys, per-host fan-out and file transfer."""
