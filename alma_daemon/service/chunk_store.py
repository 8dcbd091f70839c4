"""The chunk store: the chunks the engine took, split into training and validation examples, kept
out of Redis while they wait for a stage (pending) or for replay (kept).

One safetensors file per chunk, ``<redis.chunk_store>/<stream>/<chunk>.safetensors`` (tensors
``train.x``, ``train.y``, ``val.x``, ``val.y``), in a folder or anywhere fsspec reaches (``s3://``,
``gs://``, ... with the filesystem's package installed). Redis names the chunks a committed step
holds (``alma:{s}:pending``, ``alma:{s}:kept``); a file is a pure function of its chunk, written
before the step that adds it commits, so a step redone after a crash writes it again harmlessly.
Files no committed step names are deleted: those a stage dropped (by the :class:`RedisBuffer`
after a later stage commits, see there) and, at start-up, the leftovers of a crash
(:meth:`ChunkStore.sweep`). Safetensors only: nothing read back is unpickled.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Collection, Iterable
from pathlib import Path

import safetensors.torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from alma_daemon.config import Config, ConfigError
from alma_daemon.config.masking import mask_url
from alma_daemon.core.atomic_json import fsync_path
from alma_daemon.data.streams import SplitChunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.logs import error_text

#: The chunk store's folder under ``daemon.state_dir`` when ``redis.chunk_store`` is not set.
CHUNK_STORE = "chunks"
_CHUNK_FILE = re.compile(r"(\d+)\.safetensors")


def chunk_store_url(config: Config) -> str:
    """``redis.chunk_store``, or ``<daemon.state_dir>/chunks``."""
    return config.redis.chunk_store or str(Path(config.daemon.state_dir) / CHUNK_STORE)


class ChunkStore:
    """One stream's split chunks in the folder (or fsspec URL) ``url``, under ``<url>/<stream>/``:
    streams sharing a store (a fleet's bucket) never see each other's files."""

    def __init__(self, url: str, stream: str):
        self.url = url
        try:
            self.fs, root = url_to_fs(url)
        except (ValueError, ImportError) as error:  # an unknown protocol, or its package not installed
            raise _unusable(url, error) from None
        self.folder = f"{root.rstrip('/')}/{stream}"
        self._local = isinstance(self.fs, LocalFileSystem)

    @classmethod
    def for_config(cls, config: Config) -> ChunkStore:
        return cls(chunk_store_url(config), config.daemon.stream)

    def check_writable(self) -> None:
        """Write and delete a probe file; a store that cannot be written fails here, naming the key."""
        probe = f"{self.folder}/.probe-{uuid.uuid4().hex}"
        try:
            self.fs.makedirs(self.folder, exist_ok=True)
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)
        except Exception as error:  # any failure (permissions, network, credentials) means unusable
            raise _unusable(self.url, error) from None

    def path(self, chunk_id: int) -> str:
        return f"{self.folder}/{chunk_id}.safetensors"

    def write(self, chunk: SplitChunk) -> None:
        """Store ``chunk``: a reader sees the whole file or none, and on a local disk it is synced
        before the step that names it commits."""
        path, data = self.path(chunk.index), _encode(chunk)
        if not self._local:
            self.fs.pipe_file(path, data)  # an object store shows an object whole or not at all
            return
        tmp = f"{path}.tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.fs.mv(tmp, path)
        fsync_path(self.folder)

    def read(self, chunk_id: int) -> SplitChunk:
        path = self.path(chunk_id)
        try:
            blob = self.fs.cat_file(path)
        except FileNotFoundError:
            raise RuntimeError(f"buffered chunk {chunk_id} is missing from the chunk store ({path})") from None
        return _decode(chunk_id, blob)

    def delete(self, chunk_ids: Iterable[int]) -> None:
        """Delete the chunks' files; one already gone is no error (a sweep may have taken it)."""
        for chunk_id in chunk_ids:
            try:
                self.fs.rm_file(self.path(chunk_id))
            except FileNotFoundError:
                pass

    def sweep(self, named: Collection[int]) -> set[int]:
        """Delete every file but those of the ``named`` chunks (a committed step's pending and kept):
        files of a step that never committed, of chunks a committed stage dropped, half-written temporary
        files, probes. Returns the named chunks found."""
        found = set()
        for path in self.fs.find(self.folder, maxdepth=1):
            match = _CHUNK_FILE.fullmatch(path.rsplit("/", 1)[-1])
            if match and int(match[1]) in named:
                found.add(int(match[1]))
            else:
                self.fs.rm_file(path)
        return found


def _unusable(url: str, error: BaseException) -> ConfigError:
    return ConfigError(f"redis.chunk_store: cannot write to {mask_url(url)}: {error_text(error)}")


def _encode(chunk: SplitChunk) -> bytes:
    return safetensors.torch.save(
        {
            "train.x": chunk.train.x.contiguous(),
            "train.y": chunk.train.y.contiguous(),
            "val.x": chunk.val.x.contiguous(),
            "val.y": chunk.val.y.contiguous(),
        }
    )


def _decode(chunk_id: int, blob: bytes) -> SplitChunk:
    tensors = safetensors.torch.load(blob)
    return SplitChunk(
        chunk_id, LabeledData(tensors["train.x"], tensors["train.y"]), LabeledData(tensors["val.x"], tensors["val.y"])
    )
