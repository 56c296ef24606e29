"""Notifications without Prometheus: a job's webhooks (`notify` blocks) and its dead-man's
switch (`ping_url_file`), told of the outcomes the tick core decides on this replica.

    Note (tick/edge.py) -> message.py (pure: which outcome, the JSON body, recovered or not)
                        -> notifier.py (the core's listener: deliveries, never a wait)
                        -> sender.py (one bounded queue and one thread apart from the ticks:
                           a short timeout, a few retries; each result said and counted)

The URLs are secrets: read from their files (system/notify_rules.py), carried as `Secret`,
revealed only to the HTTP request; never in an event, an exception's text or a log.
"""
