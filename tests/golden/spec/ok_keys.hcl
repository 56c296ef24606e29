worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "report" {
  prefix   = "locks/report/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  keys     = ["tenant-1", "acme.example.com", "Tenant_2"]
}
