defaults {
  catchup = "latest"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "inherits" {
  prefix         = "locks/inherits/"
  workers        = ["worker-1"]
  schedule       = "@every 10s"
  start_deadline = "30s"
}
job "own" {
  prefix   = "locks/own/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  catchup  = "skip"
}
