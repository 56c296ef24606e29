defaults {
  catchup = "all"
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
