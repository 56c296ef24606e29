worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
worker "worker-2" {}
job "a" {
  prefix   = "locks/a/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  start_deadline = 300
}
