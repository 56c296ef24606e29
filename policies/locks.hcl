# lockctl spec: which singleton jobs exist, where each keeps its lock, and which workers may run it.
# Render the ACL policies from it with `lockctl render`; commit both, so a change shows up in review.

defaults {
  ttl        = "15s" # session TTL (Consul allows 10s..24h)
  lock_delay = "15s" # how long Consul keeps a lost lock unclaimable (0s..60s)
  kill_grace = "5s"  # SIGTERM -> SIGKILL grace when the lock is lost
}

# Each worker is a Consul node name: its sessions are made on that node's agent, over HTTPS (the
# agent asks for a client certificate: `lockctl worker-config --tls-dir` names each worker's pair).
worker "worker-1" {
  address = "https://127.0.0.21:8501"
}

worker "worker-2" {
  address = "https://127.0.0.22:8501"
}

worker "worker-3" {
  address = "https://127.0.0.23:8501"
}

# Loads yesterday's events into the warehouse; long, so a longer TTL means fewer renewals.
job "nightly-ingest" {
  prefix   = "locks/nightly-ingest/" # the lock key is locks/nightly-ingest/.lock
  workers  = ["worker-1", "worker-2"]
  ttl        = "30s"        # renewed every 10s (ttl/3)
  lock_delay = "20s"        # must stay above renew interval + kill grace + 1s (the fencing bound)
  schedule   = "0 2 * * *"
  command    = ["/usr/local/bin/nightly-ingest", "--since", "yesterday"]
}

# Sends the hourly digest mail: must never go out twice. Each hour is a tick, claimed in Consul
# with the lock, so one worker sends it even when the timers fire a second apart.
job "hourly-report" {
  prefix   = "locks/hourly-report/"
  workers  = ["worker-1", "worker-2", "worker-3"]
  schedule = "@hourly"
  command  = ["/usr/local/bin/send-report", "--hourly"]
}

# Deletes expired sessions from the app database every five minutes.
job "session-cleanup" {
  prefix         = "locks/session-cleanup/"
  workers        = ["worker-2", "worker-3"]
  renew_interval = "4s"
  lock_delay     = "10s"
  kill_grace     = "3s"
  schedule       = "*/5 * * * *"
  command        = ["/usr/local/bin/app-admin", "cleanup-sessions"]
}

# Refreshes the shared price cache every ten seconds: a job of a few milliseconds, run once per
# tick by whichever worker claims the tick first; a late run (10s) belongs to the next tick.
job "cache-refresh" {
  prefix   = "locks/cache-refresh/"
  workers  = ["worker-1", "worker-2", "worker-3"]
  schedule = "@every 10s"
  command  = ["/usr/local/bin/app-admin", "refresh-cache"]
}
