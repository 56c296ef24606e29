worker "pod-0" {
  address   = "https://consul-server.consul:8501"
  agentless = "yes"
}

job "report" {
  prefix  = "locks/report/"
  workers = ["pod-0"]
}
