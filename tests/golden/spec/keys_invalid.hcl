worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  keys    = ["tenant-1"]
}
job "b" {
  prefix   = "locks/b/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  keys     = ["tenant-1", "../escape"]
}
job "c" {
  prefix   = "locks/c/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  keys     = ["t-1", "t-2", "t-1"]
}
job "d" {
  prefix   = "locks/d/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  keys     = []
}
job "e" {
  prefix   = "locks/e/"
  workers  = ["worker-1"]
  schedule = "@every 10s"
  keys     = "tenant-1"
}
