# Two classes of pods without a Consul agent (report-0..2, ingest-0), and a VM with one (vm-1),
# which --kubernetes leaves out.
auth_method "k8s" {
  type                         = "jwt"
  bound_issuer                 = "https://kubernetes.default.svc"
  bound_audiences              = ["consul"]
  jwt_validation_pub_keys_file = "../identity/issuer.pem"
  max_token_ttl                = "10m"
  claim_mappings {
    namespace = "/kubernetes.io/namespace"
    pod       = "/kubernetes.io/pod/name"
  }
}

worker "report-0" {
  address   = "https://consul-server.consul.svc:8501"
  agentless = true
  identity {
    auth_method = "k8s"
    claims {
      namespace = "prod"
      pod       = "report-0"
    }
  }
}
worker "report-1" {
  address   = "https://consul-server.consul.svc:8501"
  agentless = true
  identity {
    auth_method = "k8s"
    claims {
      namespace = "prod"
      pod       = "report-1"
    }
  }
}
worker "report-2" {
  address   = "https://consul-server.consul.svc:8501"
  agentless = true
  identity {
    auth_method = "k8s"
    claims {
      namespace = "prod"
      pod       = "report-2"
    }
  }
}
worker "ingest-0" {
  address   = "https://consul-server.consul.svc:8501"
  agentless = true
  identity {
    auth_method = "k8s"
    claims {
      namespace = "prod"
      pod       = "ingest-0"
    }
  }
}
worker "vm-1" {
  address = "http://127.0.0.1:8500"
}

job "report" {
  prefix     = "locks/report/"
  workers    = ["report-0", "report-1", "report-2", "vm-1"]
  schedule   = "*/5 * * * *"
  command    = ["/usr/local/bin/report", "--since", "5m"]
  kill_grace = "20s"
  lock_delay = "30s"
}
job "cleanup" {
  prefix   = "locks/cleanup/"
  workers  = ["report-0", "report-1", "report-2"]
  schedule = "@hourly"
  command  = ["/usr/local/bin/cleanup"]
}
job "ingest" {
  prefix   = "locks/ingest/"
  workers  = ["ingest-0"]
  schedule = "@every 1m"
  command  = ["/usr/local/bin/ingest"]
}
