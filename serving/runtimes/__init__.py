"""What runs inside a model server: one module per server runtime, each loading checkpoint versions
from the model store (:mod:`.checkpoint`, :mod:`.bundled_model`) and answering with the task's codec
(:mod:`serving.protocols.codecs`).

- :mod:`.torchserve_handler`: TorchServe's handler, carried in every model archive;
- :mod:`.kserve` and :mod:`.kserve_server`: KServe's model server over the model store
  (``python -m serving.runtimes.kserve_server``), its repository closed by :mod:`.repository_guard`;
- :mod:`.mlserver`: MLServer's model repository and inference runtime;
- :mod:`.triton`: Triton's Python-backend model and the model repository it is served from.

Nothing here imports the daemon's side (:mod:`serving.publishing`); a module that imports a server's
own package (KServe, MLServer, Triton's backend utilities) is imported only in that server's process.
"""
