worker "worker-1" {
  address = "http://127.0.0.1 :8500"
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
}
