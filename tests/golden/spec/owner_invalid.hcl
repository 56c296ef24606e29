owner = "Payments Team"
ownr  = "billing"
owner = 7
worker "worker-1" {}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
}
