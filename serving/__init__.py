"""Serving: every checkpoint the engine writes is guarded, published and made live (docs/serving.md).

Three subpackages, by where their code runs:

- :mod:`serving.publishing`: in the daemon. The publisher's flow and its registry (``serving.kind``),
  one module per publisher, the promotion guard, the live pointer, archives and retention.
- :mod:`serving.runtimes`: inside a model server. One module per server runtime (TorchServe's
  handler, KServe's model and server, MLServer's runtime, Triton's Python-backend model and its
  repository) and the checkpoint loading they share.
- :mod:`serving.protocols`: on both sides. The codecs (one per task kind, for TorchServe's JSON and
  the Open Inference Protocol), how requests are read, the protocol's version names and the
  credentials of a server's model repository.

Each imports only those after it in this list (``[tool.importlinter]`` in pyproject.toml).
"""
