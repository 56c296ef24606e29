worker "worker-1" {
  address    = "http://127.0.0.21:8500"
  datacenter = "DC 1"
}
worker "dc2-worker-1" {
  address    = "http://127.0.1.21:8500"
  datacenter = 2
}
job "report" {
  prefix  = "locks/report/"
  workers = ["worker-1", "dc2-worker-1"]
  scope   = "global"
}
job "ledger" {
  prefix          = "locks/ledger/"
  workers         = ["worker-1"]
  home_datacenter = "dc1"
}
job "audit" {
  prefix          = "locks/audit/"
  workers         = ["worker-1"]
  home_datacenter = "Home!"
}
