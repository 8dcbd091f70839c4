"""Connections and the plumbing under both the transports and the service: TLS and login to Redis and
Kafka (:mod:`.connections`), secrets read from files (:mod:`.credentials`), riding out an outage of
Redis or the broker (:mod:`.outages`) and the Redis keyspace (:mod:`.redis_keys`). It imports no
transport and nothing of the service; the layers are in docs/architecture.md.
"""
