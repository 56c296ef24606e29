# Consul server agent server-1: rendered by lockctl from templates/consul/server.hcl.j2.
node_name            = "server-1"
datacenter           = "dc1"
data_dir             = "/var/lib/lockctl/cluster/server-1/data"
bind_addr            = "127.0.0.11"
advertise_addr       = "127.0.0.11"
client_addr          = "127.0.0.11"
server               = true
bootstrap_expect     = 3
retry_join           = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
# Join fast: the default 30s retry leaves a late agent outside for half a minute.
retry_interval       = "1s"
disable_update_check = true
disable_host_node_id = true
log_level            = "info"

performance {
  # 1 is production timing: leader election in ~1.5 s instead of 5-8 s with the default 5.
  raft_multiplier = 1
}

acl {
  enabled                  = true
  default_policy           = "deny"
  down_policy              = "extend-cache"
  enable_token_persistence = true
}
