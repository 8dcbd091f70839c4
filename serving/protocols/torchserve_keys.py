"""Where TorchServe's token keys are and how they are read: by the publisher (serving/publishing/torchserve.py)
and by ``alma serve``'s TorchServe (alma_daemon/local_servers/torchserve.py), which waits for them.

Light on purpose: ``alma serve`` imports it, and neither torch nor the publisher.
"""

from __future__ import annotations

import json
from pathlib import Path

from alma_daemon.config import Config

#: TorchServe writes its keys into its working directory, under this name.
KEY_FILE = "key_file.json"


def torchserve_folder(config: Config) -> Path:
    """The folder ``alma serve`` runs TorchServe from: its config, log, pid file and keys."""
    return Path(config.daemon.state_dir) / "torchserve"


def key_file_path(config: Config) -> Path | None:
    """Where TorchServe's keys are read from; None when token authorization is off."""
    if config.serving.key_file:
        return Path(config.serving.key_file)
    return torchserve_folder(config) / KEY_FILE if config.serving.token_auth else None


class TokenKeys:
    """The keys of TorchServe's token authorization, read from its ``key_file.json``.

    The file is read at every request because TorchServe rewrites it when a key is renewed; an
    expired key is renewed with the file's API key through the management API's ``/token``.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def key(self, api: str) -> str:
        try:
            return json.loads(self.path.read_text())[api]["key"]
        except FileNotFoundError:
            raise FileNotFoundError(
                f"TorchServe key file {self.path} not found (serving.key_file); "
                "is TorchServe running with token authorization?"
            ) from None
