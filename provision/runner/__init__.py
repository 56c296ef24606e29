"""`lockctl run` and `lockctl status`: the lock session, supervision and fencing, the child."""
