auth_method "k8s" {
  type                         = "oidc"
  bound_audiences              = "consul"
  max_token_ttl                = "10s"
  jwks_url = "x"
  claim_mappings {
    namespace       = "/kubernetes.io/namespace"
    Bad-name = "sub"
    sub = "a b"
  }
}
auth_method "k8s" {}
worker "worker-1" {
  identity {
    auth_method = "k9s"
    claims {
      namespace       = "prod\" or \"x"
    }
  }
  identity {}
}
worker "worker-2" {
  identity {
    auth_method = "k8s"
    claims {
      nspace = "prod"
    }
    extra = 1
  }
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
}
