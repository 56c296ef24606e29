defaults {
  retries          = 11
  retry_delay      = "2h"
  retry_on_timeout = "yes"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  retries = -1
}
job "b" {
  prefix      = "locks/b/"
  workers     = ["worker-1"]
  retries     = "2"
  retry_delay = "-5s"
}
job "c" {
  prefix           = "locks/c/"
  workers          = ["worker-1"]
  retries          = 2.5
  retry_delay      = 30
  retry_on_timeout = 1
}
job "d" {
  prefix      = "locks/d/"
  workers     = ["worker-1"]
  schedule    = "@every 20s"
  retries     = 1
  retry_delay = "20s"
}
