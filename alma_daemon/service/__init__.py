"""The service behind ``alma run``: the daemon's coordinator and main loop, the one-transaction step
commit, the engine's state and chunk buffer in Redis (keys in :mod:`.redis_keys`), start-up and
resume, outages of Redis and the broker, heartbeat, health, status, signals, the scheduler, and the
connections (TLS, credentials, the embedded Redis). Threads and ownership: docs/architecture.md.
"""
