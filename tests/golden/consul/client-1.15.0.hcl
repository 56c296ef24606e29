# Consul client agent worker-1: rendered by lockctl from templates/consul/client.hcl.j2.
# Its node name is the worker's name in the spec: sessions made through this agent belong to it.
node_name            = "worker-1"
datacenter           = "dc1"
data_dir             = "/var/lib/lockctl/cluster/worker-1/data"
bind_addr            = "127.0.0.21"
advertise_addr       = "127.0.0.21"
client_addr          = "127.0.0.21"
server               = false
retry_join           = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
retry_interval       = "1s"
disable_update_check = true
disable_host_node_id = true
log_level            = "info"

acl {
  enabled                  = true
  default_policy           = "deny"
  down_policy              = "extend-cache"
  enable_token_persistence = true
}

# The API over HTTPS only: plain HTTP is off.
ports {
  http  = -1
  https = 8501
  # 1.14+ opens gRPC over TLS on 8503 by default; lockctl needs no gRPC.
  grpc_tls = -1
}

# 1.12+: the tls stanza. Every connection in and out verified against the cluster's CA.
tls {
  defaults {
    ca_file         = "/var/lib/lockctl/cluster/tls/ca.pem"
    cert_file       = "/var/lib/lockctl/cluster/tls/worker-1.pem"
    key_file        = "/var/lib/lockctl/cluster/tls/worker-1-key.pem"
    verify_incoming = true
    verify_outgoing = true
  }
  internal_rpc {
    verify_server_hostname = true
  }
}

# Gossip encryption: the key from `consul keygen`. This file is 0600 because of it.
encrypt = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
