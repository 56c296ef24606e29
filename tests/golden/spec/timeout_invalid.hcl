defaults {
  timeout = "169h"
}
worker "worker-1" {
  address = "http://127.0.0.21:8500"
}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  timeout = "500ms"
}
job "b" {
  prefix  = "locks/b/"
  workers = ["worker-1"]
  timeout = "soon"
}
job "c" {
  prefix  = "locks/c/"
  workers = ["worker-1"]
  timeout = 30
}
