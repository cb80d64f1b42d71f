"""Reaching hosts: SSH connections, verified host keys, per-host fan-out and file transfer."""

import logging

# paramiko's transport thread logs its own tracebacks (a silent host's banner timeout): with no handler, Python
# prints them on stderr. The failure reaches the user as one line naming the host (HostError), so drop them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
