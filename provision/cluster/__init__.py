"""The local cluster of real Consul agents (see local.py)."""
