"""Config validation: unknown keys and bad values fail at start-up, naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

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


def test_a_file_that_is_not_yaml_is_a_config_error_naming_the_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  lr: [1\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not valid YAML: .*line 3"):
        load_config(path)


def test_a_python_tag_in_a_config_file_or_override_is_refused_not_run(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("train:\n  lr: !!python/object/apply:os.getpid []\n")
    with pytest.raises(ConfigError, match="not valid YAML: could not determine a constructor"):
        load_config(path)
    with pytest.raises(ConfigError, match="^override 'train.lr=!!python.*not valid YAML: could not determine"):
        build_config({}, ["train.lr=!!python/object/apply:os.getpid []"])


def test_numbers_in_scientific_notation_are_numbers_in_files_and_overrides(tmp_path):
    """PyYAML alone reads ``1e-3`` and ``1.0e15`` as strings (YAML 1.1); config.yaml's own example is ``1.0e15``."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-3\npolicy:\n  name: budget\n  flops_per_hour: 1.0e15\n")
    config = load_config(path, ["policy.gpu_seconds_per_hour=9E2", "learner.name=sm"])
    assert (config.train.lr, config.policy.flops_per_hour, config.policy.gpu_seconds_per_hour) == (1e-3, 1e15, 900.0)


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
    # Each section's block: from its top-level line to the next top-level key (a key's leaf name is
    # searched there only, since names such as kind, url or stream recur in several sections).
    starts = [(m.group(1), m.start()) for m in re.finditer(r"^#?\s?([a-z_]+):", text, re.M) if m.group(0)[0] != " "]
    blocks = {
        name: text[start : (starts[i + 1][1] if i + 1 < len(starts) else len(text))]
        for i, (name, start) in enumerate(starts)
    }
    for key in dotted_keys(Config):
        section, leaf = key.split(".")[0], key.split(".")[-1]
        block = blocks.get(section, "") if "." in key else text
        assert re.search(rf"^\s*#?\s*{re.escape(leaf)}:", block, re.M), f"config.yaml lacks {key}"


def model_defaults(model: type) -> dict[str, object]:
    """Each key of a config model with its default (some plugin models need keys set to be built at all)."""
    return {name: info.get_default(call_default_factory=True) for name, info in model.__pydantic_fields__.items()}


def plugin_models() -> dict[str, dict[str, type]]:
    from alma_daemon.learners import learner_config_models
    from policies import policy_config_models

    return {"learner": learner_config_models(), "policy": policy_config_models()}


def documented_plugin_keys(text: str, section: str) -> dict[str, dict[str, object]]:
    """config.yaml's ``section``: the keys (and defaults) it documents for each plugin name.

    Keys written out belong to every plugin that reads them; a commented group ``# ens, umix:`` lists
    keys (``#   members: 5``) of the plugins it names.
    """
    import re

    lines = text.split(f"\n{section}:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    written: dict[str, object] = {}
    groups: dict[str, dict[str, object]] = {}
    names: list[str] = []
    for line in lines:
        if match := re.match(r"^  (\w+): (.*)$", line):
            written.update(yaml.safe_load(f"{match[1]}: {match[2]}"))
        elif match := re.match(r"^  #   (\w+): (.*)$", line):
            for name in names:
                groups.setdefault(name, {}).update(yaml.safe_load(f"{match[1]}: {match[2]}"))
        elif match := re.match(r"^  # ([\w, -]+?)(?: \(.*\))?:", line):
            names = [n.strip() for n in match[1].split(",")]
    return {"written": written, **groups}


@pytest.mark.parametrize("section", ["learner", "policy"])
def test_config_yaml_documents_each_plugins_keys_with_their_defaults(section):
    text = (ROOT / "config.yaml").read_text()
    documented = documented_plugin_keys(text, section)
    for name, model in plugin_models()[section].items():
        defaults = {key: value for key, value in model_defaults(model).items() if key != "name"}
        own = documented.get(name, {})
        for key, default in defaults.items():
            value = own.get(key, documented["written"].get(key, "missing"))
            assert value == default, f"config.yaml documents {section}.{key} of {name} as {value!r}; it is {default!r}"
        for key in own:
            assert key in defaults, f"config.yaml lists {section}.{key} under {name}, which does not read it"


def readme_rows() -> dict[str, str]:
    """The README's configuration reference: each key of a row, with the default the row states."""
    import re

    text = (ROOT / "README.md").read_text().split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for keys_cell, defaults_cell in re.findall(r"^\| (`[^|]+`) \| (`[^|]*`) \|", text, re.M):
        keys, defaults = re.findall(r"`([^`]+)`", keys_cell), re.findall(r"`([^`]*)`", defaults_cell)
        for key, default in zip(keys, defaults * len(keys) if len(defaults) == 1 else defaults):
            rows[key] = default
    return rows


def test_readme_reference_states_the_models_defaults_and_every_learner_and_policy_key():

    from alma_daemon.config import Config

    rows = readme_rows()
    defaults = {key: value for key, value in flat_defaults(Config()).items()}
    for section, models in plugin_models().items():
        for model in models.values():
            for key, value in model_defaults(model).items():
                defaults.setdefault(f"{section}.{key}", set()).add(repr(value))
    for key, stated in rows.items():
        assert key in defaults, f"README documents {key}, which is no config key"
        expected = defaults[key]
        stated_value = repr(yaml.safe_load(stated))
        if isinstance(expected, set):
            if key.endswith(".name"):
                continue
            assert stated_value in expected, f"README: {key} defaults to one of {expected}, not {stated}"
        else:
            assert stated_value == repr(expected), f"README: {key} defaults to {expected!r}, not {stated}"
    for key in defaults:
        if key.startswith(("learner.", "policy.")):
            assert key in rows, f"README's configuration reference lacks {key}"


def flat_defaults(config, prefix: str = "") -> dict[str, object]:
    import dataclasses

    out: dict[str, object] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in ("learner", "policy") and not prefix:
            continue
        if dataclasses.is_dataclass(value):
            out.update(flat_defaults(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = value
    return out


def test_a_key_of_another_learner_names_the_key_and_the_chosen_learner():
    with pytest.raises(ConfigError, match=r"learner\.grow_members: not read by the 'sm' learner"):
        build_config({}, ["learner.grow_members=2"])
    with pytest.raises(ConfigError, match=r"learner\.width: not read by the 'switch-lm' learner"):
        build_config({"learner": {"name": "switch-lm", "width": 8}})
    with pytest.raises(ConfigError, match=r"learner\.name: unknown learner 'nope'; known: ens, "):
        build_config({}, ["learner.name=nope"])
    assert build_config({}, ["learner.name=gens", "learner.grow_members=2"]).learner.grow_members == 2


def test_the_learner_and_policy_registries_refuse_a_name_twice_a_name_not_narrowed_and_an_unknown_name():
    from alma_daemon.config import PolicyConfig, policy_config
    from alma_daemon.learners import learner_class, register_learner
    from policies import build_policy, register_policy

    fixed = type(build_policy(policy_config()))
    for register, existing, kind in [
        (register_learner, learner_class("sm"), "learner"),
        (register_policy, fixed, "policy"),
    ]:
        with pytest.raises(ValueError, match=rf"^{kind} name '{existing.name}' registered twice$"):
            register(existing)
        unnarrowed = type("Unnarrowed", (), {"name": "unnarrowed", "config_model": existing.config_model})
        with pytest.raises(
            ValueError, match=rf"^{kind} 'unnarrowed': its config_model must narrow name to Literal\['unnarrowed'\]$"
        ):
            register(unnarrowed)
    with pytest.raises(KeyError, match=r"unknown learner 'nope'; known: ens, "):
        learner_class("nope")
    with pytest.raises(KeyError, match=r"unknown policy 'nope'; known: adaptive, budget, "):
        build_policy(PolicyConfig(name="nope"))


def test_config_schema_command_prints_a_schema_that_shipped_configs_pass_and_foreign_keys_fail(capsys):
    import json

    import jsonschema

    from alma_daemon.cli import main

    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    tags = {s["$ref"].rsplit("/", 1)[1] for s in schema["properties"]["learner"]["oneOf"]}
    assert len(tags) == len(plugin_models()["learner"])
    validator = jsonschema.Draft202012Validator(schema)
    for path in [ROOT / "config.yaml", *sorted((ROOT / "examples").glob("*.yaml"))]:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, f"{path.name}: {errors}"
    assert validator.is_valid({"learner": {"width": 8}}), "without learner.name, the learner is sm"
    assert not validator.is_valid({"learner": {"members": 3}})
    assert not validator.is_valid({"learner": {"name": "sm", "members": 3}})
    assert not validator.is_valid({"policy": {"name": "fixed", "cron": "0 2 * * *"}})
    assert validator.is_valid({"learner": {"name": "ens", "members": 3}, "policy": {"name": "geometric", "ratio": 0.5}})


def test_config_check_command_names_the_bad_key(tmp_path, capsys):
    from alma_daemon.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text("learner: {name: sm, members: 3}\n")
    assert main(["config", "check", str(path)]) == 2
    assert "learner.members: not read by the 'sm' learner" in capsys.readouterr().err
    path.write_text("learner: {name: ens, members: 3}\n")
    assert main(["config", "check", str(path)]) == 0
    # What a command would refuse once started: an arrays stream without its task; a device torch cannot parse.
    path.write_text("dataset: {name: arrays}\n")
    assert main(["config", "check", str(path)]) == 2
    assert "dataset.input_shape" in capsys.readouterr().err
    path.write_text("device: 'cuda:x'\n")
    assert main(["config", "check", str(path)]) == 2
    assert "device: must be auto, cpu, cuda or cuda:N" in capsys.readouterr().err
    path.write_text("device: 'cuda:1'\n")
    assert main(["config", "check", str(path)]) == 0
    # A wait the simulated stream never reaches: valid (a live stream may go on), with a note.
    path.write_text("stream: {megabatches: 10}\npolicy: {name: fixed, wait: 50}\n")
    assert main(["config", "check", str(path)]) == 0
    assert "note: valid for alma run, but alma simulate and alma grid refuse it: policy.wait (50)" in (
        capsys.readouterr().out
    )


def test_config_check_takes_the_file_as_other_commands_do_too(tmp_path, capsys):
    from alma_daemon.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text("learner: {name: sm, members: 3}\n")
    assert main(["config", "check", "--config", str(path)]) == 2
    assert "learner.members" in capsys.readouterr().err
    assert main(["config", "check", str(path), "--config", str(path)]) == 2
    assert capsys.readouterr().err == (
        "alma config check: error: give the config file as FILE or as --config FILE, not both\n"
    )
    assert main(["config", "check"]) == 2
    assert (
        capsys.readouterr().err == "alma config check: error: which config file? Give it as FILE or as --config FILE\n"
    )


def test_a_fixed_wait_longer_than_the_simulated_stream_is_refused_at_start_naming_both_keys(tmp_path, capsys):
    from alma_daemon.cli import main
    from alma_daemon.research.grid import load_grid

    out = tmp_path / "run"
    argv = ["simulate", "--config", str(ROOT / "examples/mnist-sm.yaml"), "--set", "policy.wait=50"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "alma simulate: config error: policy.wait (50) is larger than stream.megabatches (10): "
        "the run would never train\n"
    )
    assert not out.exists()
    # A grid refuses that combination before its first run trains, and runs the others.
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"base: {ROOT / 'examples/mnist-sm.yaml'}\ngrid: {{policy.wait: [10, 11]}}\n")
    (_, ten), (_, eleven) = load_grid(grid)
    assert not isinstance(ten, ConfigError) and ten.policy.wait == 10
    assert str(eleven) == "policy.wait (11) is larger than stream.megabatches (10): the run would never train"
    # The daemon's live stream may go on past stream.megabatches: the config itself is valid.
    assert build_config({}, ["policy.wait=50"]).policy.wait == 50


def test_a_key_of_another_plugin_says_where_it_was_set_and_what_to_do(tmp_path, capsys):
    from alma_daemon.cli import main

    path = tmp_path / "mnist.yaml"
    path.write_text("learner: {name: sm, width: 8}\npolicy: {name: fixed, wait: 1}\n")
    # Switching policy on the command line leaves the file's keys of the old one behind.
    assert main(["config", "check", str(path), "--set", "policy.name=adaptive"]) == 2
    assert capsys.readouterr().err == (
        f"alma config check: config error: policy.wait: not read by the 'adaptive' policy (set in {path}); to "
        f'switch policy and drop the file\'s policy keys: --set \'policy={{"name": "adaptive"}}\'\n'
    )
    assert main(["config", "check", str(path), "--set", 'policy={"name": "adaptive"}']) == 0
    capsys.readouterr()
    # A key given on the command line that the chosen learner does not read: the learners that read it.
    assert main(["config", "check", str(path), "--set", "learner.grow_members=2"]) == 2
    assert capsys.readouterr().err == (
        "alma config check: config error: learner.grow_members: not read by the 'sm' learner; "
        "the learners that read it: gens, switch-lm-gens\n"
    )
    assert main(["config", "check", str(path), "--set", "policy.ratio=2"]) == 2
    assert capsys.readouterr().err.endswith("the policies that read it: geometric\n")
    # The file contradicts itself.
    path.write_text("learner: {name: sm, members: 3}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"learner.members: not read by the 'sm' learner (set in {path}); the learners")
    with pytest.raises(ConfigError, match=r"^learner\.members: not read by the 'sm' learner; the learners that read"):
        build_config({"learner": {"name": "sm", "members": 3}})


def test_a_checkpoint_spec_saved_with_every_learners_keys_still_loads():
    """Specs written while one flat config class served every learner carry all of its keys."""
    from alma_daemon.data.datasets import MNIST_TASK
    from alma_daemon.learners import build_learner, learner_from_spec
    from tests.conftest import learner_settings

    spec = build_learner("ens", MNIST_TASK, learner_settings("ens", {"width": 8, "members": 3}), 0).spec()
    spec["config"] = {**spec["config"], "name": "sm", "grow_members": 1, "gating": "soft", "d_model": 128}
    config = learner_from_spec(spec).config
    assert (config.name, config.width, config.members) == ("ens", 8, 3)
    # Keys it never had are not dropped: a renamed or unknown key fails, naming it.
    spec["config"]["member_count"] = 3
    with pytest.raises(ConfigError, match="spec.config.member_count"):
        learner_from_spec(spec)
