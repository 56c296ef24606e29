"""`lockctl schedule`: the long-lived scheduler each replica runs (issue 15)."""
