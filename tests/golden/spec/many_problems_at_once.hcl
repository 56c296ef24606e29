defaults {
  lock_dely = "1s"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
worker "worker-2" {}
job "a" {
  prefix  = "/abs/"
  workers = ["worker-7"]
  ttl = "1s"
}
job "B" {
  prefix  = "locks/b"
  workers = ["worker-1"]
}
cron "x" {}
