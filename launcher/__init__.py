"""ddpctl: launch PyTorch DDP experiments locally, on SSH hosts and on Vast.ai.

Importing this package must never import torch: the launcher runs on laptops without it.
"""

__version__ = "0.1.0"
