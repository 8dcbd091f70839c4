"""Every kind of plugin, one place: its registry, what the config accepts and describes, and the docs agree.

A registry is the truth; beside it some lists are kept by hand (mostly so that reading a config imports no
torch), and the docs name the plugins. Each ``*_problems()`` below reads them all as they are and returns
every disagreement as a line; its test asserts there is none, and a second test breaks one list for the
length of the test (``monkeypatch``, ``drop``) and asserts the check says so: no check can silently pass.
CONTRIBUTING.md, "Adding a plugin", names these lists.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib
import pkgutil
import re
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import TypeAdapter

from alma_daemon.config import ConfigError, LearnerConfig, PolicyConfig, build_config

ROOT = Path(__file__).parents[1]


def text(path: str) -> str:
    return (ROOT / path).read_text()


def section(page: str, start: str, end: str) -> str:
    """The part of ``page`` from the line opening with ``start`` to the next line opening with ``end``."""
    match = re.search(rf"^{re.escape(start)}.*?(?=^{re.escape(end)})", page, re.S | re.M)
    assert match, f"no section {start!r} ... {end!r}"
    return match.group(0)


def backticked(snippet: str) -> list[str]:
    return re.findall(r"`([^`\s]+)`", snippet)


def accepted(model: type, field: str) -> set[str]:
    """The values the config accepts for ``field`` of section ``model``, from its JSON Schema."""
    schema = TypeAdapter(model).json_schema()["properties"][field]
    choices = [schema, *schema.get("anyOf", [])]
    return {value for choice in choices for value in choice.get("enum", [])}


def field_description(model: type, field: str) -> str:
    from alma_daemon.config.reference import keys

    return next(key.description for key in keys(model) if key.name == field)


def listed_names(description: str) -> set[str]:
    """The names a plugin's ``name`` description lists: ``The learner: sm, ens, ...`` (then ``.`` or `` (``)."""
    match = re.search(r": (.*?)(?: \(|\.$)", description)
    assert match, description
    return set(match.group(1).split(", "))


def accepted_plugin_names(kind: type[LearnerConfig] | type[PolicyConfig]) -> set[str]:
    """The ``name`` values the config accepts for a plugin section, as its refusal of another lists them."""
    with pytest.raises(ConfigError) as refused:
        kind.choose({"name": "no-such-plugin"})
    return set(str(refused.value).split("known: ", 1)[1].split(", "))


@pytest.fixture
def drop():
    """``drop(registry, name)`` deletes a name from a registry until the test ends, then puts it back where
    it was (``monkeypatch.delitem`` appends it: the config reference lists the plugins in their order)."""
    saved: list[tuple[dict, dict]] = []

    def drop_(registry: dict, name: str) -> None:
        saved.append((registry, dict(registry)))
        del registry[name]

    yield drop_
    for registry, items in reversed(saved):
        registry.clear()
        registry.update(items)


def difference(what: str, found: Iterable[str], expected: Iterable[str]) -> list[str]:
    """One line if ``found`` differs from ``expected`` (as sets), naming what it lacks and what it has besides."""
    lacks, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if not lacks and not extra:
        return []
    return [f"{what}: lacks {lacks}, extra {extra}"]


# -- learners and policies: the modules that register them -----------------------------------------------------------


def builtin_module_problems() -> list[str]:
    """Each module of learners/ and policies/ that registers a plugin is in its package's BUILTIN_MODULES,
    which the registry imports; a module missing there registers only once something else imports it."""
    import alma_daemon.learners as learners_package
    import policies as policies_package

    problems = []
    for package in (learners_package, policies_package):
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
        registry = package.LEARNERS if package is learners_package else package.POLICIES
        registering = {cls.__module__.rsplit(".", 1)[1] for cls in registry.values()}
        problems += difference(f"{package.__name__}.BUILTIN_MODULES", package.BUILTIN_MODULES, registering)
    return problems


def test_every_module_that_registers_a_plugin_is_a_builtin_module():
    assert builtin_module_problems() == []


def test_a_module_missing_from_builtin_modules_is_found(monkeypatch):
    import policies

    monkeypatch.setattr(policies, "BUILTIN_MODULES", [m for m in policies.BUILTIN_MODULES if m != "forecast"])
    assert builtin_module_problems() == ["policies.BUILTIN_MODULES: lacks ['forecast'], extra []"]


# -- learners --------------------------------------------------------------------------------------------------------


def learner_problems(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The learner registry against: ``BUILTIN_CONFIGS`` (learners/configs.py, torch-free: what a config read
    without the learners knows), in ``BUILTIN_MODULES``' order; the ``learner.name`` values the config
    accepts, with and without the learners imported; the names ``learner.name``'s description lists; the
    README's list of learners (``switch-lm*`` stands for the family) and docs/results.md's."""
    from alma_daemon import learners
    from alma_daemon.learners.configs import BUILTIN_CONFIGS

    names = set(learners.learner_names())
    builtins = {
        n: c for n, c in learners.LEARNERS.items() if c.__module__.rsplit(".", 1)[1] in learners.BUILTIN_MODULES
    }
    problems = difference("BUILTIN_CONFIGS", BUILTIN_CONFIGS, builtins)
    problems += [
        f"BUILTIN_CONFIGS[{name!r}] is not {cls.__name__}.config_model"
        for name, cls in builtins.items()
        if name in BUILTIN_CONFIGS and BUILTIN_CONFIGS[name] is not cls.config_model
    ]
    order = [builtins[name].__module__.rsplit(".", 1)[1] for name in BUILTIN_CONFIGS if name in builtins]
    if order != [module for module in learners.BUILTIN_MODULES if module in order]:
        problems.append(f"BUILTIN_CONFIGS is not in BUILTIN_MODULES' order: {order}")
    problems += difference("learner.name accepts", accepted_plugin_names(LearnerConfig), names)
    with monkeypatch.context() as torch_free:  # a process that imported no learner: the entry point alone
        torch_free.setattr(learners, "LEARNERS", {})
        problems += difference("learner.name accepts without torch", accepted_plugin_names(LearnerConfig), names)
    problems += difference("learner.name's description", listed_names(field_description(LearnerConfig, "name")), names)

    readme = section(text("README.md"), "**Learners**", "**Policies**")
    patterns = [token for token in backticked(readme) if re.fullmatch(r"[a-z][a-z*-]*", token)]
    problems += [
        f"README.md does not name the learner {name}"
        for name in sorted(names)
        if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns)
    ]
    problems += [f"README.md names no learner {p}" for p in patterns if not fnmatch.filter(sorted(names), p)]
    page = section(text("docs/results.md"), "## Learners, backbones and training", "Growing learners")
    documented = {name for line in re.findall(r"^- (.*?):", page, re.M) for name in backticked(line)}
    problems += difference("docs/results.md's learners", documented, names)
    return problems


def test_the_learners_registry_config_and_docs_agree(monkeypatch):
    assert learner_problems(monkeypatch) == []


def test_a_learner_missing_from_a_list_is_found(monkeypatch, drop):
    from alma_daemon.learners import configs

    drop(configs.BUILTIN_CONFIGS, "umix")
    problems = learner_problems(monkeypatch)
    assert "BUILTIN_CONFIGS: lacks ['umix'], extra []" in problems
    assert "learner.name accepts without torch: lacks ['umix'], extra []" in problems


def test_a_learner_missing_from_the_registry_is_found(monkeypatch, drop):
    from alma_daemon import learners

    learners.learner_names()
    drop(learners.LEARNERS, "firefly")
    problems = learner_problems(monkeypatch)
    assert "docs/results.md's learners: lacks [], extra ['firefly']" in problems
    assert "README.md names no learner firefly" in problems


# -- policies --------------------------------------------------------------------------------------------------------


def policy_problems() -> list[str]:
    """The policy registry against: the ``policy.name`` values the config accepts (through the entry point);
    the names ``policy.name``'s description lists; the README's list of policies; the ``## `<name>```
    sections of docs/policies.md."""
    from policies import policy_names

    names = set(policy_names())
    problems = difference("policy.name accepts", accepted_plugin_names(PolicyConfig), names)
    problems += difference("policy.name's description", listed_names(field_description(PolicyConfig, "name")), names)
    readme = section(text("README.md"), "**Policies**", "## Documentation")
    problems += difference("README.md's policies", backticked(readme), names)
    sections = re.findall(r"^## `([^`]+)`", text("docs/policies.md"), re.M)
    problems += difference("docs/policies.md's sections", sections, names)
    return problems


def test_the_policies_registry_config_and_docs_agree():
    assert policy_problems() == []


def test_a_policy_missing_from_a_list_is_found(drop):
    import policies

    policies.policy_names()
    drop(policies.POLICIES, "budget")
    # The config reads its policies from the registry (the entry point): only the docs are left behind.
    assert policy_problems() == [
        "README.md's policies: lacks [], extra ['budget']",
        "docs/policies.md's sections: lacks [], extra ['budget']",
    ]


# -- measures --------------------------------------------------------------------------------------------------------

#: How docs/measures.md names the task kinds of a measure, as MEASURE_TRAITS does.
DOC_KINDS = {
    "classification": ("binary", "multiclass"),
    "binary": ("binary",),
    "regression": ("regression",),
    "language models": ("language_model",),
}


def measure_problems() -> list[str]:
    """The measure registry (``MEASURES``) against: ``MEASURE_NAMES``, ``task.measure``'s accepted values and
    its description (which names each); ``MEASURE_TRAITS`` (direction, rate, kinds, in the registry's
    order); docs/measures.md's "The measures" (each name, with its kinds and direction)."""
    from alma_daemon.config.measure_traits import MEASURE_TRAITS
    from alma_daemon.config.sections import MEASURE_NAMES, TaskConfig
    from alma_daemon.measures import MEASURES

    names = set(MEASURES)
    problems = difference("MEASURE_NAMES", MEASURE_NAMES, names)
    problems += difference("task.measure accepts", accepted(TaskConfig, "measure"), names)
    description = field_description(TaskConfig, "measure")
    problems += [
        f"task.measure's description does not name {n}"
        for n in sorted(names)
        if not re.search(rf"\b{n}\b", description)
    ]
    traits = [(n, t.higher_is_better, t.rate, t.kinds) for n, t in MEASURE_TRAITS.items()]
    own = [(n, c.higher_is_better, c.rate, c.kinds) for n, c in MEASURES.items()]
    if traits != own:
        problems.append(f"MEASURE_TRAITS differ from the measures' own traits: {sorted(set(traits) ^ set(own))}")

    page = section(text("docs/measures.md"), "## The measures", "**The task's other measures.**")
    documented = {}
    for line in re.findall(r"^- (.*)$", page, re.M):
        head, _, terms = line.partition(" (")
        kinds, _, direction = terms.partition(")")[0].partition("; ")
        for name in backticked(head):
            documented[name] = (direction == "higher is better", DOC_KINDS.get(kinds, (kinds,)))
    problems += difference("docs/measures.md's measures", documented, names)
    problems += [
        f"docs/measures.md says {name} is {'higher' if higher else 'lower'} is better, for {kinds}"
        for name, (higher, kinds) in documented.items()
        if name in MEASURES and (higher, kinds) != (MEASURES[name].higher_is_better, MEASURES[name].kinds)
    ]
    return problems


def test_the_measures_registry_traits_config_and_docs_agree():
    assert measure_problems() == []


def test_a_measure_missing_from_a_list_is_found(monkeypatch):
    from alma_daemon.config import measure_traits
    from alma_daemon.measures import MEASURES

    class Brier(MEASURES["mse"]):
        name = "brier"

    monkeypatch.setitem(MEASURES, "brier", Brier)
    monkeypatch.setitem(measure_traits.MEASURE_TRAITS, "mse", measure_traits.MeasureTraits(higher_is_better=True))
    problems = measure_problems()
    for line in (
        "MEASURE_NAMES: lacks ['brier'], extra []",
        "task.measure accepts: lacks ['brier'], extra []",
        "task.measure's description does not name brier",
        "docs/measures.md's measures: lacks ['brier'], extra []",
    ):
        assert line in problems
    assert any(line.startswith("MEASURE_TRAITS differ") for line in problems)


# -- publishers ------------------------------------------------------------------------------------------------------


def publisher_problems() -> list[str]:
    """``PUBLISHERS`` (serving/publishing) against ``serving.kind``'s accepted values, less ``none`` (which
    publishes nothing), and its description; each factory builds the publisher of its own kind; docs/serving.md's
    table of kinds and its ``kind`` key name every accepted kind."""
    from alma_daemon.config.sections import ServingConfig
    from serving.publishing import PUBLISHERS, make_publisher

    kinds = accepted(ServingConfig, "kind")
    problems = difference("PUBLISHERS", PUBLISHERS, kinds - {"none"})
    description = field_description(ServingConfig, "kind")
    problems += [
        f"serving.kind's description does not name {kind}" for kind in sorted(kinds) if f'"{kind}"' not in description
    ]
    for kind in sorted(set(PUBLISHERS) & kinds):
        built = make_publisher(build_config(overrides=[f"serving.kind={kind}"]))
        if getattr(built, "kind", None) != kind:
            problems.append(
                f"PUBLISHERS[{kind!r}] builds a {type(built).__name__} of kind {getattr(built, 'kind', None)!r}"
            )
    page = text("docs/serving.md")
    table = section(page, "| `serving.kind` |", "All apply")
    problems += difference("docs/serving.md's table of kinds", re.findall(r"^\| `([a-z]+)`", table, re.M), kinds)
    key = re.search(r"^- `kind` \(`[a-z]+`\): (.*)$", page, re.M)
    problems += difference("docs/serving.md's serving.kind", backticked(key.group(1)) if key else [], kinds)
    return problems


def test_the_publishers_and_the_serving_kinds_agree():
    assert publisher_problems() == []


def test_a_kind_without_a_publisher_is_found_and_refused(drop):
    from serving.publishing import PUBLISHERS, make_publisher

    drop(PUBLISHERS, "triton")
    assert publisher_problems() == ["PUBLISHERS: lacks ['triton'], extra []"]
    # Built anyway, it fails naming the kind, rather than publishing nothing as `none` does.
    with pytest.raises(KeyError, match="serving.kind 'triton' has no publisher"):
        make_publisher(build_config(overrides=["serving.kind=triton"]))
    assert make_publisher(build_config(overrides=["serving.kind=none"])) is None


# -- codecs ----------------------------------------------------------------------------------------------------------


def codec_problems() -> list[str]:
    """``CODECS`` (serving/protocols/codecs.py) against the kinds a ``TaskInfo`` can have: those some learner
    trains (``task_kinds``), among them ``task.kind``'s accepted values; and through ``TaskInfo.target_kind``
    (a classifier: binary or multiclass) the measures' ``TASK_KINDS``."""
    from alma_daemon.config.sections import TaskConfig
    from alma_daemon.data.task_info import TaskInfo
    from alma_daemon.learners import learner_class, learner_names
    from alma_daemon.measures import TASK_KINDS
    from serving.protocols.codecs import CODECS

    trained = {kind for name in learner_names() for kind in learner_class(name).task_kinds}
    problems = difference("CODECS", CODECS, trained)
    problems += [
        f"task.kind {kind} is a kind no learner trains" for kind in sorted(accepted(TaskConfig, "kind") - trained)
    ]
    targets = {TaskInfo(kind, (1,), classes).target_kind for kind in CODECS for classes in (2, 10)}
    problems += difference("the measures' TASK_KINDS", targets, TASK_KINDS)
    return problems


def test_the_codecs_serve_every_kind_of_task():
    assert codec_problems() == []


def test_a_task_kind_without_a_codec_is_found(drop):
    from serving.protocols.codecs import CODECS

    drop(CODECS, "regression")
    assert codec_problems() == [
        "CODECS: lacks ['regression'], extra []",
        "the measures' TASK_KINDS: lacks ['regression'], extra []",
    ]


# -- sources (transports) --------------------------------------------------------------------------------------------


def source_problems(transports: set[str]) -> list[str]:
    """``build_source`` against ``transports`` (``kafka.transport``'s accepted values): each builds a source
    of its own (its ``server`` is the transport's name; nothing connects at construction), and every source
    class of alma_daemon/transports is built for one of them."""
    import alma_daemon.transports as package

    problems, built = [], set()
    config = build_config()
    for transport in sorted(transports):
        kafka = copy.copy(config.kafka)
        object.__setattr__(kafka, "transport", transport)  # a value the Literal does not hold yet, too
        source: Any = package.build_source(SimpleNamespace(kafka=kafka), client=object())
        built.add(type(source))
        if source.server != transport:
            problems.append(f"kafka.transport {transport} builds a {type(source).__name__} ({source.server})")
    classes = set()
    for module in pkgutil.iter_modules(package.__path__):
        loaded = importlib.import_module(f"{package.__name__}.{module.name}")
        classes |= {
            c
            for n, c in vars(loaded).items()
            if n.endswith("Source") and hasattr(c, "server") and c.__module__ == loaded.__name__
        }
    problems += [f"{cls.__name__} is built for no kafka.transport" for cls in sorted(classes - built, key=str)]
    return problems


def test_every_transport_builds_its_own_source():
    from alma_daemon.config.sections import KafkaConfig

    assert source_problems(accepted(KafkaConfig, "transport")) == []


def test_a_transport_without_a_source_is_found():
    from alma_daemon.config.sections import KafkaConfig

    # What build_source does with a value added to kafka.transport's Literal alone: a Kafka source.
    assert source_problems(accepted(KafkaConfig, "transport") | {"pulsar"}) == [
        "kafka.transport pulsar builds a KafkaSource (kafka)"
    ]
    assert source_problems({"kafka"}) == ["RedisStreamSource is built for no kafka.transport"]


# -- commands --------------------------------------------------------------------------------------------------------


def command_problems() -> list[str]:
    """``cli.COMMANDS`` against the modules of alma_daemon/commands, the subcommands the parser has (each
    module's, in ``COMMANDS``' order: a module's ``_`` is a ``-``), and the ``alma <command>`` the README,
    CONTRIBUTING.md and docs/ mention (every subcommand, and none that is not one)."""
    import argparse

    import alma_daemon.commands as package
    from alma_daemon import cli

    problems = []
    if len(set(cli.COMMANDS)) != len(cli.COMMANDS):
        problems.append(f"cli.COMMANDS names a module twice: {cli.COMMANDS}")
    modules = [module.name for module in pkgutil.iter_modules(package.__path__)]
    problems += difference("cli.COMMANDS", cli.COMMANDS, modules)
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if list(subcommands) != [module.replace("_", "-") for module in cli.COMMANDS]:
        problems.append(f"the parser's subcommands {list(subcommands)} are not cli.COMMANDS {cli.COMMANDS}")
    pages = ["README.md", "CONTRIBUTING.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
    mentioned = {name for page in pages for name in re.findall(r"(?:`|^)alma ([a-z][a-z_-]*)", text(page), re.M)}
    problems += difference("the docs' alma commands", mentioned, set(subcommands))
    return problems


def test_the_commands_modules_parser_and_docs_agree():
    assert command_problems() == []


def test_a_command_missing_from_commands_is_found(monkeypatch):
    from alma_daemon import cli

    monkeypatch.setattr(cli, "COMMANDS", [name for name in cli.COMMANDS if name != "grid"])
    assert command_problems() == [
        "cli.COMMANDS: lacks ['grid'], extra []",
        "the docs' alma commands: lacks [], extra ['grid']",
    ]
