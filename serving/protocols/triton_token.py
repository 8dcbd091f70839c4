"""Where ``alma serve --kind triton`` keeps its files, and the token that closes its model repository.

Triton asks a header of the APIs it is told to restrict (``--http-restricted-api``): ``alma serve
--kind triton`` restricts the model repository (load, unload, index) and the APIs that change the
server (logging, trace, shared memory) to ``Authorization: Bearer <token>``, the header the publisher
sends (:class:`serving.publishing.oip.OipClient`); inference, health, metadata and statistics stay open.
The token is kept as KServe's is (:mod:`serving.protocols.repository_token`): ``serving.repository_token_file`` where
set, else ``<daemon.state_dir>/triton/repository_token``, which the server writes at its first start.
Light on purpose: ``alma serve`` imports it.
"""

from __future__ import annotations

from pathlib import Path

from alma_daemon.config import Config
from serving.protocols.repository_token import TOKEN_FILE, RepositoryToken, read_token


def triton_folder(config: Config) -> Path:
    """The folder ``alma serve --kind triton`` runs Triton from: its log, pid file, backend and token."""
    return Path(config.daemon.state_dir) / "triton"


def token_path(config: Config) -> Path:
    """``serving.repository_token_file``, else the token ``alma serve --kind triton`` writes."""
    named = config.serving.repository_token_file
    return Path(named) if named else triton_folder(config) / TOKEN_FILE


class TritonToken(RepositoryToken):
    """The publisher's credentials for Triton's model repository (module docstring)."""

    @classmethod
    def for_config(cls, config: Config) -> TritonToken:
        return cls(token_path(config), bool(config.serving.repository_token_file))

    def refused_hint(self) -> str:
        where = f"serving.repository_token_file ({self.path}{'' if self.path.exists() else ', not there'})"
        return (
            f"Triton wants its repository token: point {where} at the token file of the server "
            f"(`alma serve --kind triton` writes <daemon.state_dir>/triton/{TOKEN_FILE})"
        )


def check_token(config: Config) -> None:
    """At a daemon's start: a named token file must be readable; the default one may not exist yet
    (the server writes it), or belong to a Triton run without a token."""
    path = token_path(config)
    if config.serving.repository_token_file:
        read_token(path)
    elif path.exists():
        read_token(path, named=False)
