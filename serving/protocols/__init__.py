"""What the daemon and a model server agree on, imported by both sides of serving.

- :mod:`.codecs`: the one registry of codecs, one per task kind, each answering in TorchServe's JSON
  and in the Open Inference Protocol (:mod:`.tensors`), with the request checks of :mod:`.requests`;
- :mod:`.version_names`: checkpoint versions as model names on an Open Inference Protocol server, and
  the default file;
- the credentials of a server's model repository: :mod:`.repository_token` (KServe's model server),
  :mod:`.triton_token` (Triton) and :mod:`.torchserve_keys` (TorchServe's token keys).
"""
