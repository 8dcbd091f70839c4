"""``python -m serving.runtimes.kserve_server``: KServe's model server over a model store.

``alma serve --kind kserve`` runs it (alma_daemon/local_servers/kserve.py); so can a container or a
KServe ``InferenceService`` (docs/deploy.md). It needs alma-daemon, torch and ``kserve`` (the
``kserve`` extra), and the model store at the path the daemon writes it.

Its model repository API (load, unload, index) answers only requests with the token of
``--repository-token-file`` (serving/protocols/repository_token.py); ``--open-repository`` leaves it open to anyone
who reaches the port, for a server fenced some other way. One of the two is required.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m serving.runtimes.kserve_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model-store", required=True, type=Path, help="daemon.checkpoint_dir")
    parser.add_argument("--model-name", default="alma", help="serving.model_name")
    parser.add_argument("--http-port", type=int, default=8080, help="the protocol's REST port")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (serving.bind_host): 127.0.0.1 by default, 0.0.0.0 in a container",
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA where present), cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--niceness",
        type=int,
        default=0,
        help="serving.niceness, taken once the server serves a version (it starts at normal priority)",
    )
    closed = parser.add_mutually_exclusive_group(required=True)
    closed.add_argument(
        "--repository-token-file",
        type=Path,
        help="serving.repository_token_file: the model repository API answers only requests with this token",
    )
    closed.add_argument(
        "--open-repository",
        action="store_true",
        help="leave the model repository API open to every client that reaches the port",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    from alma_daemon.config import ConfigError
    from alma_daemon.logs import configure_logging
    from serving.protocols.repository_token import read_token

    try:
        token = read_token(args.repository_token_file) if args.repository_token_file else None
    except ConfigError as err:
        print(f"python -m serving.runtimes.kserve_server: --repository-token-file: {err}", file=sys.stderr)
        return 2
    configure_logging()
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    # KServe parses the command line when it is imported, and takes prefixes of its own options
    # (--model_...) from ours.
    sys.argv = sys.argv[:1]
    from serving.runtimes.kserve import serve

    serve(
        args.model_store, args.model_name, args.http_port, device, host=args.host, token=token, niceness=args.niceness
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
