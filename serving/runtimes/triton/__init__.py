"""Checkpoint versions served by Triton Inference Server's Python backend (``serving.kind: triton``).

:mod:`.model` is the backend's model (``TritonPythonModel``): it runs in Triton's stub process, the only
place ``triton_python_backend_utils`` exists. :mod:`.served` is what it does with a request, importable
anywhere (tests, the setup script's check). :mod:`.repository` writes the model repository Triton
serves them from, one folder per name (the publisher writes it, ``alma serve --kind triton`` reads it).
"""
