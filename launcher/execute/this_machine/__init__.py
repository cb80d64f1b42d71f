"""A run on this machine: torchrun as a child process, detached like nohup, its state measured from outside."""
