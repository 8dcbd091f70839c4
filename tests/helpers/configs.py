"""Learner configs from one set of small sizes shared by every learner."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from alma_daemon.config import Config, LearnerConfig, build_config, learner_config


def config_for_any_learner(data: dict, overrides: Sequence[str] = ()) -> Config:
    """``build_config(data, overrides)`` where ``data["learner"]`` holds small sizes for every learner: the
    keys the chosen learner does not read are dropped, as :func:`learner_settings` does."""
    from alma_daemon.learners import learner_class

    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("learner.name=")]
    name = chosen[-1] if chosen else data.get("learner", {}).get("name", "sm")
    keys = {f.name for f in dataclasses.fields(learner_class(name).config_model)}
    learner = {k: v for k, v in data.get("learner", {}).items() if k in keys}
    return build_config({**data, "learner": learner}, list(overrides))


def learner_settings(name: str, shared: dict, overrides: dict | None = None) -> LearnerConfig:
    """Learner ``name``'s config from ``shared`` small sizes (``width``, ``members``, ...) without the keys it
    does not read, so that one set serves every learner, and ``overrides`` as given: a key the learner
    does not read there fails, as it would in a user's config."""
    from alma_daemon.learners import learner_class

    keys = {f.name for f in dataclasses.fields(learner_class(name).config_model)}
    return learner_config({**{k: v for k, v in shared.items() if k in keys}, **(overrides or {})}, name=name)


def sea_stream_config(train: dict, learner: dict | None = None, stream: dict | None = None) -> Config:
    """A small River SEA stream (5 chunks of 300) trained at every chunk by the team's tabular MLP, without a
    reference learner: what the stage-candidate tests (scratch, linear) compare runs on."""
    return build_config(
        {
            "seed": 3,
            "dataset": {"name": "river", "river_stream": "sea", "river_examples": 1500},
            "stream": {"megabatches": 5, "seed": 3, **(stream or {})},
            "learner": learner or {"name": "sm", "model": "examples.custom.tabular:build"},
            "train": {"epochs": 2, "patience": 1, **train},
            "policy": {"name": "fixed", "wait": 1},
            "reference": {"kind": "none"},
        }
    )
