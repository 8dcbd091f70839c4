"""Helpers shared by several test modules; test modules import from here, never from one another.

- ``servers``: the pytest plugin that starts real Redis, Kafka (Tansu), Prometheus and TorchServe
  (loaded by ``tests/conftest.py``; see ``docs/test-servers.md``), and ``tls_proxy`` (its TLS relay).
- ``data``: small deterministic data sets (``separable_data``, ``TINY_MNIST``, ``have``).
- ``configs``: learner configs from one set of small sizes (``learner_settings``, ``config_for_any_learner``).
- ``contract``: the learner contract's tasks and training steps (also run by ``tests/ranks_worker.py``).
- ``switch_lm``: a tiny Switch LM learner and trainer.
- ``text``: a tiny text corpus and a small Switch LM run's config.
- ``records``: wire records of tiny chunks, the bad ones, and Kafka ingest helpers.
- ``daemon``: daemon configs, in-process runs with crashes, ``alma`` and ``torchrun`` subprocesses.
- ``serving``: small learners and checkpoints for the publishers' tests.
"""
