worker "worker-1" {
  address    = "http://127.0.0.21:8500"
  datacenter = "dc1"
}
worker "dc2-worker-1" {
  address    = "http://127.0.1.21:8500"
  datacenter = "dc2"
}
job "report" {
  prefix  = "locks/report/"
  workers = ["worker-1", "dc2-worker-1"]
}
