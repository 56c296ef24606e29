defaults {
  overlap = "cancel"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "inherits" {
  prefix   = "locks/inherits/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
}
job "own" {
  prefix   = "locks/own/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  overlap  = "skip"
}
job "plain" {
  prefix  = "locks/plain/"
  workers = ["worker-1"]
}
job "buffers" {
  prefix   = "locks/buffers/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  overlap  = "buffer_one"
}
