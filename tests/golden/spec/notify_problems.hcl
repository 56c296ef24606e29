defaults {
  ping_url_file = "ping.url"
}
worker "worker-1" {}
job "a" {
  prefix   = "locks/a/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  notify "ops" {
    on = ["failed", "exploded"]
  }
  notify "chat" {
    url_file = "https://hooks.example.com/services/T0/B0/XXXXXXXX"
    url      = "https://hooks.example.com/services/T0/B0/XXXXXXXX"
  }
  notify "chat" {
    url_file = "/etc/lockctl/chat.url"
  }
  notify {
    url_file = "/etc/lockctl/x.url"
  }
  notify "pager" {
    url_file = "/etc/lockctl/pager.url"
    on       = []
  }
  notify "pager2" {
    url_file     = "/etc/lockctl/pager.url"
    repeat_after = "soon"
  }
  notify "pager3" {
    url_file     = "/etc/lockctl/pager.url"
    repeat_after = "500ms"
  }
}
job "b" {
  prefix   = "locks/b/"
  workers  = ["worker-1"]
  schedule = "@hourly"
  notify "ping" {
    url_file = "/etc/lockctl/ping.url"
  }
}
