"""The ACL pipeline: render policies from the spec, lint them, plan against live Consul, apply
them, bootstrap a cluster's ACL system."""
