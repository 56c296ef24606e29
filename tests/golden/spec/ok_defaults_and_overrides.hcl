defaults {
  ttl = "20s"
  lock_delay = "10s"
  renew_interval = "5s"
  kill_grace = "2s"
  min_hold = "30s"
  start_deadline = "90s"
  history_limit = 50
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
worker "worker-2" {}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  ttl = "1m30s"
  schedule = "0 2 * * *"
  command = ["/opt/jobs/a", "--flag=1", "two words", "%p $HOME"]
  start_deadline = "1h"
  history_limit = 10000
}
job "b" {
  prefix  = "locks/b/"
  workers = ["worker-2", "worker-1"]
  lock_delay = "60s"
  renew_interval = "1s"
}
job "c" {
  prefix  = "locks/c/"
  workers = ["worker-2"]
  start_deadline = "1s" # no schedule: accepted, and unused
  history_limit = 10
}
