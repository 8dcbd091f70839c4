"""Deterministic seeds derived from a base seed and a purpose.

Every random draw (partition, chunk split, model init, each training stage's shuffling) gets its
own seed from (base seed, purpose, index), so a run that is killed and restarted at stage k replays
exactly the randomness an uninterrupted run would have used at stage k.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *purpose: object) -> int:
    """A 63-bit seed that depends only on ``seed`` and ``purpose``."""
    text = "/".join([str(seed), *map(str, purpose)]).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def generator(seed: int, *purpose: object, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator seeded with :func:`derive_seed`."""
    return torch.Generator(device=device).manual_seed(derive_seed(seed, *purpose))
