"""The tick ledger: one record per scheduled tick of a job, kept in Consul beside its lock."""
