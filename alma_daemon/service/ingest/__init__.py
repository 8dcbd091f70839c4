"""Ingest: records from a transport into the Redis buffer, exactly once.

Reading order for one record: a consumer from :mod:`alma_daemon.transports` -> :mod:`.worker`
(validation with ``data/wire.py``) -> :mod:`.assembler` -> :mod:`.store` (one MULTI/EXEC with the
offsets). The engine side continues in ``alma_daemon/service/redis_buffer.py``; the whole path is
drawn in ``docs/architecture.md``.
"""
