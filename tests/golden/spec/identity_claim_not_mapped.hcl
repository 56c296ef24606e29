auth_method "k8s" {
  type                         = "jwt"
  jwt_validation_pub_keys_file = "issuer.pem"
  max_token_ttl                = "10m"
  claim_mappings {
    namespace = "/kubernetes.io/namespace"
  }
}
worker "worker-1" {
  identity {
    auth_method = "k8s"
    claims {
      nspace = "prod"
    }
  }
}
worker "worker-2" {
  identity {
    auth_method = "k8s"
  }
}
worker "worker-3" {
  identity "x" {
    auth_method = "k8s"
    claims "y" {
      namespace = "prod"
    }
  }
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
}
