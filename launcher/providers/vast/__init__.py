"""Renting machines on Vast.ai: API client, API key, offers, provisioning and teardown."""
