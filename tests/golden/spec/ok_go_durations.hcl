worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
worker "worker-2" {}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  ttl = "1h0m10.5s"
  lock_delay = "2500ms"
  renew_interval = "1s"
  kill_grace = "0"
  min_hold = "24h"
}
