defaults {
  overlap = "allow"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "a" {
  prefix   = "locks/a/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  overlap  = "buffer_all"
}
job "b" {
  prefix   = "locks/b/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  overlap  = "Cancel"
}
job "c" {
  prefix   = "locks/c/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  overlap  = true
}
job "d" {
  prefix  = "locks/d/"
  workers = ["worker-1"]
  overlap = "cancel"
}
