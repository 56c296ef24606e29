auth_method "k8s" {
  type                         = "jwt"
  bound_issuer                 = "https://kubernetes.default.svc"
  bound_audiences              = ["consul"]
  jwt_validation_pub_keys_file = "issuer.pem"
  max_token_ttl                = "10m"
  claim_mappings {
    namespace       = "/kubernetes.io/namespace"
    service_account = "/kubernetes.io/serviceaccount/name"
  }
}

worker "worker-1" {
  identity {
    auth_method = "k8s"
    claims {
      namespace       = "prod"
      service_account = "worker-1"
    }
  }
}

worker "worker-2" {
  identity {
    auth_method = "k8s"
    claims {
      namespace       = "prod"
      service_account = "worker-2"
    }
  }
}

job "report" {
  prefix  = "locks/report/"
  workers = ["worker-1", "worker-2"]
}
