"""The service behind ``alma run``: the daemon's coordinator and main loop, the one-transaction step
commit, the engine's state and chunk buffer in Redis (keys in :mod:`alma_daemon.infra.redis_keys`),
start-up and resume, riding out outages of Redis and the broker, heartbeat, health, status, signals,
the scheduler, and the embedded Redis; the connections are in :mod:`alma_daemon.infra`. Threads and
ownership: docs/architecture.md.
"""
