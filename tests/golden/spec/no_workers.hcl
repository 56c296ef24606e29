job "a" {
  prefix  = "locks/a/"
  workers = []
}
