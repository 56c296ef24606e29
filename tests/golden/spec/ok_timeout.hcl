defaults {
  timeout = "30m"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "inherits" {
  prefix   = "locks/inherits/"
  workers  = ["worker-1"]
  schedule = "@hourly"
}
job "own" {
  prefix   = "locks/own/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  timeout  = "2s"
}
