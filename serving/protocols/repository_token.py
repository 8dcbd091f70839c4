"""The token that closes the model repository API of ``alma serve --kind kserve``.

KServe's model server as alma serves it (:mod:`serving.runtimes.kserve`) answers inference and health to
anyone who reaches its port, and the model repository (load, unload, index) only to a request that
carries ``Authorization: Bearer <token>``: otherwise anyone on the network could unload the model.
The token is the content of one file, ``serving.repository_token_file``, as TorchServe's keys are
(serving/protocols/torchserve_keys.py):

- left unset, it is ``<daemon.state_dir>/kserve/repository_token``: ``alma serve --kind kserve``
  writes it at its first start (random, mode 0600) and keeps it; a daemon with the same config
  reads it there;
- set, it names a file someone provides (a Kubernetes Secret, a compose secret), which must exist:
  the server and the daemon both read it, and nothing writes it.

The server reads it once, at its start; the publisher (:class:`RepositoryToken`) at each repository
request, so a daemon started before the server, or a token renewed by deleting the file and starting
the server again, needs no restart. Light on purpose: ``alma serve`` imports it, and neither torch nor
KServe.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from alma_daemon.config import Config, ConfigError

#: The config key that names the file, as every message says it.
KEY = "serving.repository_token_file"
#: The file's name in the server's folder, where it is left unset.
TOKEN_FILE = "repository_token"
#: A line of shell that writes a new token, for the messages that ask for one.
MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))' > <file>; chmod 600 <file>"


def kserve_folder(config: Config) -> Path:
    """The folder ``alma serve --kind kserve`` runs KServe's model server from: its log, pid file and token."""
    return Path(config.daemon.state_dir) / "kserve"


def token_path(config: Config) -> Path:
    """Where the token is: ``serving.repository_token_file``, else the one ``alma serve`` writes."""
    named = config.serving.repository_token_file
    return Path(named) if named else kserve_folder(config) / TOKEN_FILE


def write_token(path: Path) -> None:
    """Write a new random token to ``path`` (mode 0600, readable by this user only), unless a file is
    there already: a token kept across restarts keeps a running daemon's valid."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # kept from an earlier start
    except OSError as err:
        raise ConfigError(
            f"{KEY}: cannot write {path} ({err.strerror}): make daemon.state_dir writable by this user, or set "
            f"the key to a token file you provide"
        ) from None
    with os.fdopen(handle, "w") as file:
        file.write(secrets.token_urlsafe(32) + "\n")


def read_token(path: Path, named: bool = True) -> str:
    """The token in ``path``, or :class:`ConfigError` on one line naming the key and the fix.

    ``named``: whether ``serving.repository_token_file`` named the file (else it is the one
    ``alma serve`` writes), which changes the fix.
    """
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        fix = (
            f"create it ({MAKE_ONE}) or mount the secret there"
            if named
            else "start the server with `alma serve --kind kserve` (it writes the file), or set the key to the "
            "server's token file"
        )
        raise ConfigError(f"{KEY}: {path} does not exist: {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ConfigError(
            f"{KEY}: cannot read {path} ({reason}): run as the user that owns it, or give this user a copy "
            f"and set the key to it"
        ) from None
    if not token or any(character.isspace() for character in token):
        raise ConfigError(f"{KEY}: {path} holds no token (one line, no spaces): write one ({MAKE_ONE})")
    return token


def check_token(config: Config) -> None:
    """At a daemon's start: the token file named by ``serving.repository_token_file`` must be readable
    (:func:`read_token`'s one line otherwise). The default file may be missing: the server it belongs to
    may not have started yet, or the server is another one that wants none."""
    if config.serving.repository_token_file:
        read_token(token_path(config))
    else:
        path = token_path(config)
        if path.exists():
            read_token(path, named=False)


class RepositoryToken:
    """The publisher's credentials for the model repository, read from their file at each request
    (module docstring). A file that is not there, where the key is unset, means no credentials: the
    server is another one (MLServer, Triton, an OIP server behind a proxy of its own)."""

    def __init__(self, path: Path, named: bool) -> None:
        self.path = path
        self.named = named

    @classmethod
    def for_config(cls, config: Config) -> RepositoryToken:
        return cls(token_path(config), bool(config.serving.repository_token_file))

    def value(self) -> str | None:
        """The token; None where the key is unset and ``alma serve`` has written none."""
        if not self.named and not self.path.exists():
            return None
        return read_token(self.path, self.named)

    def refused_hint(self) -> str:
        """What a refused repository request means, for the error that says so."""
        where = f"{KEY} ({self.path}{'' if self.path.exists() else ', not there'})"
        return (
            f"the server wants its repository token: point {where} at the token file of the server "
            f"(`alma serve --kind kserve` writes <daemon.state_dir>/kserve/{TOKEN_FILE})"
        )
