worker "worker-1" {}
job "around" {
  prefix  = "lockctl/"
  workers = ["worker-1"]
}
