"""``python -m serving.kserve_server``: KServe's model server over a model store.

``alma serve --kind kserve`` runs it (alma_daemon/local_servers/kserve.py); so can a container or a
KServe ``InferenceService`` (docs/deploy.md). It needs alma-daemon, torch and ``kserve`` (the
``kserve`` extra), and the model store at the path the daemon writes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.kserve_server", description=__doc__.split("\n")[0])
    parser.add_argument("--model-store", required=True, type=Path, help="daemon.checkpoint_dir")
    parser.add_argument("--model-name", default="alma", help="serving.model_name")
    parser.add_argument("--http-port", type=int, default=8080, help="the protocol's REST port (all interfaces)")
    parser.add_argument("--device", default="auto", help="auto (CUDA where present), cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    from alma_daemon.logs import configure_logging

    configure_logging()
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    # KServe parses the command line when it is imported, and takes prefixes of its own options
    # (--model_...) from ours.
    sys.argv = sys.argv[:1]
    from serving.kserve_model import serve

    serve(args.model_store, args.model_name, args.http_port, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
