"""Config validation: unknown keys and bad values fail at start-up, naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from alma_daemon.config import ConfigError, PolicyConfig, build_config, load_config

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


def shipped_configs() -> list[str]:
    """config.yaml and every example config, in subfolders too (grids are checked where they are run)."""
    examples = (ROOT / "examples").rglob("*.yaml")
    configs = [p for p in examples if "grid" not in yaml.safe_load(p.read_text())]
    return ["config.yaml", *sorted(str(p.relative_to(ROOT)) for p in configs)]


@pytest.mark.parametrize("path", shipped_configs())
def test_shipped_configs_are_valid(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # learner.model names a module of examples/ from the repository root
    load_config(ROOT / path)


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def plugin_models() -> dict[str, dict[str, type]]:
    from alma_daemon.learners import learner_config_models
    from policies import policy_config_models

    return {"learner": learner_config_models(), "policy": policy_config_models()}


@pytest.mark.parametrize("name", ["docs/config.md", "config.yaml"])
def test_the_config_reference_is_generated_from_the_models_descriptions(name):
    from alma_daemon.config.reference import reference_files

    assert (ROOT / name).read_text() == reference_files()[name], f"{name} is stale: run `alma config docs`"


def test_the_generated_config_yaml_states_every_default_so_that_it_loads_back():
    from alma_daemon.config import Config
    from alma_daemon.config.loading import _load_yaml
    from alma_daemon.config.reference import config_markdown, config_yaml, yaml_value

    assert build_config(_load_yaml(config_yaml())) == Config()
    # The keys of the other learners and policies are commented out: their defaults, as written, load back too.
    markdown = config_markdown()
    for section, models in plugin_models().items():
        for name, model in models.items():
            assert f"### {section} `{name}`" in markdown
            for key, info in model.__pydantic_fields__.items():
                default = info.get_default(call_default_factory=True)
                assert _load_yaml(f"{key}: {yaml_value(default)}") == {key: default}, f"{section}.{key} of {name}"
                assert f"{key}: {yaml_value(default)}" in config_yaml() or key == "name", f"{section}.{key}"
    for value in (1e15, 1e-3, None, [], [28, 28], "0 2 * * *", "127.0.0.1:9092", 0.1):
        assert _load_yaml(f"k: {yaml_value(value)}") == {"k": value}


def test_config_docs_writes_the_reference_and_its_check_names_the_stale_file(tmp_path, capsys):
    from alma_daemon.cli import main

    assert main(["config", "docs", "--check", "--root", str(tmp_path)]) == 1
    assert "config.md is stale" in capsys.readouterr().err
    assert main(["config", "docs", "--root", str(tmp_path)]) == 0
    assert main(["config", "docs", "--check", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "config.yaml").read_text() == (ROOT / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    capsys.readouterr()
    assert main(["config", "docs", "--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"alma config docs: {tmp_path / 'config.yaml'} is stale; run `alma config docs` to regenerate it\n"
    )


def test_a_key_of_another_learner_names_the_key_and_the_chosen_learner():
    with pytest.raises(ConfigError, match=r"learner\.grow_members: not read by the 'sm' learner"):
        build_config({}, ["learner.grow_members=2"])
    with pytest.raises(ConfigError, match=r"learner\.width: not read by the 'switch-lm' learner"):
        build_config({"learner": {"name": "switch-lm", "width": 8}})
    with pytest.raises(ConfigError, match=r"learner\.name: unknown learner 'nope'; known: ens, "):
        build_config({}, ["learner.name=nope"])
    assert build_config({}, ["learner.name=gens", "learner.grow_members=2"]).learner.grow_members == 2


def test_a_registry_refuses_a_name_twice_a_misnamed_plugin_a_declaration_not_its_class_and_an_unknown_name(
    monkeypatch,
):
    from types import SimpleNamespace

    from alma_daemon.learners import learner_class
    from alma_daemon.registry import LEARNERS, POLICIES
    from policies import build_policy

    fixed = POLICIES["fixed"]
    with pytest.raises(ValueError, match=r"^policy name 'fixed' registered twice$"):
        POLICIES.register("fixed", fixed)
    with pytest.raises(ValueError, match=r"^policy 'waiting': .* calls itself 'fixed'$"):
        POLICIES.register("waiting", fixed)
    assert "waiting" not in POLICIES
    # A declaration whose class does not name it back (its config_model is sm's own): refused at every lookup.
    learner_class("sm")
    monkeypatch.setitem(LEARNERS.entries, "sm", SimpleNamespace(implementation="alma_daemon.learners.sm:SingleModel"))
    monkeypatch.delitem(LEARNERS._loaded, "sm")
    for _ in range(2):
        with pytest.raises(TypeError, match=r"^learner 'sm': alma_daemon.learners.sm:SingleModel.config_model is not"):
            learner_class("sm")
    # A class that calls itself by another name than its entry point's would write specs no one can reload.
    LEARNERS.register("sm-alias", SimpleNamespace(implementation="alma_daemon.learners.sm:SingleModel"))
    try:
        with pytest.raises(ValueError, match=r"^learner 'sm-alias': .* calls itself 'sm'$"):
            learner_class("sm-alias")
    finally:
        LEARNERS.unregister("sm-alias")
    with pytest.raises(KeyError, match=r"unknown learner 'nope'; known: ens, "):
        learner_class("nope")
    with pytest.raises(KeyError, match=r"unknown policy 'nope'; known: adaptive, budget, "):
        build_policy(PolicyConfig(name="nope"))


def test_a_registry_without_the_installed_package_says_to_install_it(monkeypatch):
    import importlib.metadata

    from alma_daemon import registry

    def not_installed(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(registry, "distribution", not_installed)
    registry._require_installed.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"alma-daemon is not installed in .*: run `pip install -e \.`"):
            registry.Registry("learner", "alma_daemon.learners").names()
    finally:
        registry._require_installed.cache_clear()


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
    # Switching policy on the command line drops the file's keys of the old one, saying so in one line.
    assert main(["config", "check", str(path), "--set", "policy.name=adaptive"]) == 0
    captured = capsys.readouterr()
    assert "policy adaptive" in captured.out
    assert captured.err.count("\n") == 1
    assert captured.err.rstrip().endswith(
        "config: policy.name=adaptive from --set: dropped policy.wait (adaptive does not read it)"
    )
    assert main(["config", "check", str(path), "--set", 'policy={"name": "adaptive"}']) == 0
    assert capsys.readouterr().err == ""
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


def test_a_plugin_named_with_set_drops_the_files_keys_it_does_not_read_in_one_logged_line(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text("learner: {name: ens, width: 8, members: 3}\npolicy: {name: fixed, wait: 2, grow_every: 0}\n")
    with caplog.at_level("WARNING", logger="alma_daemon.config"):
        config = load_config(path, ["policy.name=adaptive"])
    assert (config.policy.name, config.policy.grow_every) == ("adaptive", 0)  # the key adaptive reads stays
    assert [r.getMessage() for r in caplog.records] == [
        "config: policy.name=adaptive from --set: dropped policy.wait (adaptive does not read it)"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="alma_daemon.config"):
        config = load_config(path, ["learner.name=switch-lm-ens", "learner.layers=3"])
    assert (config.learner.name, config.learner.members, config.learner.layers) == ("switch-lm-ens", 3, 3)
    assert [r.getMessage() for r in caplog.records] == [
        "config: learner.name=switch-lm-ens from --set: dropped learner.width (switch-lm-ens does not read it)"
    ]
    caplog.clear()
    # Nothing to drop, nothing said; a name that is not switched on the command line drops nothing.
    with caplog.at_level("WARNING", logger="alma_daemon.config"):
        assert load_config(path, ["learner.name=umix"]).learner.members == 3
        assert load_config(path, ["policy.wait=3"]).policy.wait == 3
    assert caplog.records == []
    # A key given with --set that the chosen plugin does not read still fails, naming the plugins that read it.
    with pytest.raises(
        ConfigError, match=r"^policy\.wait: not read by the 'adaptive' policy; the policies that read it: fixed$"
    ):
        load_config(path, ["policy.name=adaptive", "policy.wait=3"])
    # The file's own keys are checked against the plugin the file names, as before.
    with pytest.raises(ConfigError, match=r"^learner\.name: unknown learner 'nope'"):
        load_config(path, ["learner.name=nope"])
    path.write_text("policy: {name: fixed, wait: 2}\n")
    with pytest.raises(ConfigError, match=r"^policy\.cron / policy\.interval_seconds: the schedule policy needs"):
        load_config(path, ["policy.name=schedule"])
    assert load_config(path, ["policy.name=schedule", "policy.cron=0 2 * * *"]).policy.cron == "0 2 * * *"


def test_a_dropped_wait_is_not_held_against_the_simulated_stream(tmp_path, capsys):
    from alma_daemon.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("policy: {name: fixed, wait: 50}\nstream: {megabatches: 10}\n")
    config = load_config(path, ["policy.name=adaptive"])
    config.policy.check_stream_length(config.stream.megabatches)  # what alma simulate checks at start
    assert main(["config", "check", str(path), "--set", "policy.name=adaptive"]) == 0
    captured = capsys.readouterr()
    assert "note:" not in captured.out and "dropped policy.wait" in captured.err


def test_a_checkpoint_spec_with_a_key_its_learner_does_not_read_fails_naming_it():
    from alma_daemon.data.datasets import MNIST_TASK
    from alma_daemon.learners import build_learner, learner_from_spec
    from tests.conftest import learner_settings

    spec = build_learner("ens", MNIST_TASK, learner_settings("ens", {"width": 8, "members": 3}), 0).spec()
    config = learner_from_spec(spec).config
    assert (config.name, config.width, config.members) == ("ens", 8, 3)
    # A renamed or unknown key is not dropped: it fails, naming it.
    spec["config"]["member_count"] = 3
    with pytest.raises(ConfigError, match="spec.config.member_count"):
        learner_from_spec(spec)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["policy.max_model_age_seconds=0.5"], "policy.max_model_age_seconds: 0.5 s is below daemon.poll_seconds=1"),
        (
            ["stream.chunk_examples=100", "train.max_stage_examples=50"],
            "train.max_stage_examples: 50 is smaller than one chunk (stream.chunk_examples=100)",
        ),
        (
            [
                "stream.chunk_examples=100",
                "stream.replay=true",
                "stream.replay_keep=window",
                "stream.replay_examples=99",
            ],
            "stream.replay_examples: 99 is smaller than one chunk",
        ),
        (
            ["stream.replay=false", "stream.replay_keep=window"],
            "stream.replay_keep: window, but stream.replay is false",
        ),
        (["stream.replay_keep=window"], "stream.replay_examples: stream.replay_keep window needs"),
        (["stream.replay=true", "stream.replay_examples=100"], "stream.replay_examples: set, but stream.replay true"),
        (["task.decision=recall"], "task.decision_target: task.decision recall needs"),
        (["task.decision=threshold", "task.decision_target=1.5"], "task.decision_target: 1.5 is outside (0, 1)"),
        (["task.decision_target=0.3"], "task.decision_target: set, but task.decision auto reads none"),
        (["task.decision=cost"], "task.decision: cost reads task.false_negative_cost"),
        (
            ["stream.replay=true", "stream.replay_keep=reservoir"],
            "stream.replay_examples: stream.replay_keep reservoir needs",
        ),
        (["policy.max_model_age_chunks=0"], "policy.max_model_age_chunks"),
    ],
)
def test_bounds_that_cannot_hold_fail_at_start_up_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config({}, overrides)
