worker "worker-1" {}
job "inside" {
  prefix  = "lockctl/control/inside/"
  workers = ["worker-1"]
}
job "beside" {
  prefix  = "lockctl/controls/"
  workers = ["worker-1"]
}
