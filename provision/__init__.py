"""lockctl: run a job on exactly one of N workers behind a Consul session lock."""

__version__ = "0.1.0"
