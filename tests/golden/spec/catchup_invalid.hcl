defaults {
  catchup = "always"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  catchup = "Latest"
}
job "b" {
  prefix  = "locks/b/"
  workers = ["worker-1"]
  catchup = true
}
job "c" {
  prefix         = "locks/c/"
  workers        = ["worker-1"]
  catchup        = "all"
  catchup_limit  = 0
}
job "d" {
  prefix         = "locks/d/"
  workers        = ["worker-1"]
  catchup        = "all"
  catchup_limit  = "5"
}
job "e" {
  prefix         = "locks/e/"
  workers        = ["worker-1"]
  catchup        = "all"
  catchup_window = "0s"
}
job "f" {
  prefix         = "locks/f/"
  workers        = ["worker-1"]
  catchup        = "all"
  catchup_window = "169h"
}
job "g" {
  prefix         = "locks/g/"
  workers        = ["worker-1"]
  catchup        = "all"
  catchup_window = "an hour"
}
job "h" {
  prefix         = "locks/h/"
  workers        = ["worker-1"]
  catchup        = "latest"
  catchup_limit  = 20
}
job "i" {
  prefix         = "locks/i/"
  workers        = ["worker-1"]
  catchup        = "skip"
  catchup_window = "2h"
}
