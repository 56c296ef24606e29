defaults {
  lock_delay = "15s"
}
worker "worker-1" {}
job "inherits-the-delay" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  ttl     = "30s"
}
job "own-delay" {
  prefix     = "locks/b/"
  workers    = ["worker-1"]
  lock_delay = "6s"
}
job "just-safe" {
  prefix     = "locks/c/"
  workers    = ["worker-1"]
  lock_delay = "11.001s"
}
