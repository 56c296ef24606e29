defaults {
  catchup        = "all"
  catchup_window = "30m"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "inherits" {
  prefix   = "locks/inherits/"
  workers  = ["worker-1"]
  schedule = "@every 1m"
}
job "own" {
  prefix         = "locks/own/"
  workers        = ["worker-1"]
  schedule       = "@hourly"
  catchup_limit  = 24
  catchup_window = "168h"
}
job "latest" {
  prefix   = "locks/latest/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  catchup  = "latest"
}
