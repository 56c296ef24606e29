worker "worker-1" {}
job "a" {
  prefix  = "locks/a/"
  workers = ["worker-1"]
  command = "/bin/sh -c 'rm -rf /'"
}
job "b" {
  prefix  = "locks/b/"
  workers = ["worker-1"]
  command = ["relative/path"]
}
job "c" {
  prefix  = "locks/c/"
  workers = ["worker-1"]
  command = []
}
job "d" {
  prefix  = "locks/d/"
  workers = ["worker-1"]
  command = ["/bin/echo", "line\nbreak"]
}
