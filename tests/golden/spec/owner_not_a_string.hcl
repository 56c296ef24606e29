owner = ["payments"]
worker "worker-1" {}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
}
