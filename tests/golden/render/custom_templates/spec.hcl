worker "node-a" {
  address = "https://10.0.0.5:8501"
}
worker "node-b" {}
job "billing-close" {
  prefix  = "service/billing/locks/close/"
  workers = ["node-b", "node-a"]
}
job "backup" {
  prefix  = "service/backup/"
  workers = ["node-a"]
}
