"""Real servers started and supervised on this machine: one implementation for ``alma dev up|down|status``
(alma_daemon/commands/dev.py: Redis, a Kafka-protocol broker and Prometheus, without Docker), ``alma
serve`` (TorchServe), the integration tests' fixtures (tests/helpers/servers.py, docs/test-servers.md)
and the benchmarks.

- :mod:`.processes`: a server as its own process group (``ServerProcess``), free loopback ports,
  readiness, stopping a whole group, finding it again by its pid;
- :mod:`.servers`: Redis, Tansu (Kafka protocol) and Prometheus;
- :mod:`.torchserve`: TorchServe.

It sits beside the service in the layers (docs/architecture.md#layers): the daemon, the transports
and the publishers never start a server, so only the commands, the tests and the benchmarks import it.
"""
