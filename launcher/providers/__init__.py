"""Where a run happens: the interface of what acquires hosts and releases them (base.py); each provider lives in its
place's folder (launcher/places/local/machine.py, ssh/hosts.py, vast/provider.py)."""
