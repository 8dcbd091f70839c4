"""A tiny text corpus and the config of a small Switch LM run on it."""

from __future__ import annotations

from pathlib import Path

from alma_daemon.config import Config, build_config

TINY_LM = {"name": "switch-lm", "layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "experts": 2}


def corpus(tmp_path: Path) -> list[str]:
    """Two files, three equal parts of fixed-width lines: ``aaaa bbbb`` text first, ``qqqq rrrr`` after."""
    first = "aaaa bbbb aaaa bbbb ab\n" * 60
    rest = "qqqq rrrr qqqq rrrr qr\n" * 120
    (tmp_path / "one.txt").write_text(first + rest[: 23 * 30])
    (tmp_path / "two.txt").write_text(rest[23 * 30 :])
    return [str(tmp_path / "one.txt"), str(tmp_path / "two.txt")]


def text_config(tmp_path: Path, **sections: dict) -> Config:
    data = {
        "dataset": {"name": "text", "files": corpus(tmp_path), "vocab_size": 300},
        "stream": {"megabatches": 2, "seq_len": 16},
        "learner": TINY_LM,
        "train": {"batch_size": 8, "steps_per_chunk": 3, "warmup_steps": 1},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return build_config(data)
