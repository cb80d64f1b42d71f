"""Where a run happens: each provider acquires hosts and releases them (this machine, SSH hosts, Vast.ai)."""
