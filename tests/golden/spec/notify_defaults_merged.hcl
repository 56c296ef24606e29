# notify blocks in defaults go to every job; a job's block of the same name replaces the
# inherited one, its others add to them; its ping_url_file is its own
defaults {
  notify "ops" {
    url_file     = "/etc/lockctl/ops.url"
    on           = ["failed", "lost"]
    repeat_after = "4h"
  }
}
worker "worker-1" {}
job "nightly" {
  prefix        = "locks/nightly/"
  workers       = ["worker-1"]
  schedule      = "0 2 * * *"
  ping_url_file = "/etc/lockctl/nightly.ping"
  notify "chat" {
    url_file = "/etc/lockctl/chat.url"
    on       = ["recovered", "failed"]
  }
}
job "report" {
  prefix   = "locks/report/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  notify "ops" {
    url_file = "/etc/lockctl/ops-report.url"
  }
}
