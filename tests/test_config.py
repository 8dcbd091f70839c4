"""Config validation: unknown keys and bad values fail at start-up, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from alma_daemon.config import ConfigError, build_config, load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "data,overrides,key",
    [
        ({"learner": {"widht": 8}}, [], "learner.widht"),
        ({"nonsense": 1}, [], "nonsense"),
        ({}, ["learner.width=abc"], "learner.width"),
        ({}, ["learner.width=0"], "learner.width"),
        ({}, ["stream.replay=maybe"], "stream.replay"),
        ({}, ["dataset.name=imagenet"], "dataset.name"),
        ({}, ["stream.val_fraction=1.5"], "stream.val_fraction"),
        ({}, ["train.patience=-1"], "train.patience"),
        ({}, ["device=tpu"], "device"),
        ({"stream": 5}, [], "stream"),
        ({}, ["policy.wait"], "policy.wait"),
    ],
)
def test_errors_name_the_key(data, overrides, key):
    with pytest.raises(ConfigError) as info:
        build_config(data, overrides)
    assert key in str(info.value)


def test_overrides_are_typed_and_nested():
    config = build_config(
        {},
        [
            "learner.name=ens",
            "learner.width=16",
            "policy.wait=10",
            "stream.replay=true",
            "train.lr=0.5",
            "dataset.root=null",
        ],
    )
    assert (config.learner.name, config.learner.width, config.policy.wait) == ("ens", 16, 10)
    assert config.stream.replay is True and config.train.lr == 0.5 and config.dataset.root is None


def test_integers_are_accepted_where_floats_are_expected():
    assert build_config({"train": {"lr": 1}}).train.lr == 1.0


@pytest.mark.parametrize("path", ["config.yaml", *sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))])
def test_shipped_configs_are_valid(path):
    load_config(ROOT / path if path == "config.yaml" else ROOT / "examples" / path)


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def dotted_keys(cls, prefix: str = "") -> list[str]:
    import dataclasses

    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            keys += dotted_keys(f.default_factory, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys


def test_config_yaml_documents_every_key_with_its_default():
    import re

    from alma_daemon.config import Config

    text = (ROOT / "config.yaml").read_text()
    loaded = load_config(ROOT / "config.yaml")
    assert loaded == Config()
    for key in dotted_keys(Config):
        assert re.search(rf"^\s*#?\s*{re.escape(key.split('.')[-1])}:", text, re.M), f"config.yaml lacks {key}"
