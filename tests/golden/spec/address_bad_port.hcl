worker "worker-1" {
  address = "http://127.0.0.1:99999"
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
}
