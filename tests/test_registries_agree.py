"""Every kind of plugin, one place: its registry, what the config accepts and describes, and the docs agree.

The registries (alma_daemon/registry.py) are the truth, fed by pyproject.toml's entry points; the config
derives its names from them, and the docs name the plugins. Each ``*_problems()`` below reads them all as
they are and returns every disagreement as a line; its test asserts there is none, and a second test breaks
one side for the length of the test (``monkeypatch``, ``drop``) and asserts the check says so: no check can
silently pass. CONTRIBUTING.md, "Adding a plugin", says what to write.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib
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
    """``drop(registry, name)`` takes a plugin out of a registry until the test ends, then puts the registry
    back as it was (its names' order too: the config reference lists the plugins in that order)."""
    saved: list[tuple[Any, dict]] = []

    def drop_(registry: Any, name: str) -> None:
        saved.append((registry, dict(registry.entries)))
        registry.unregister(name)

    yield drop_
    for registry, entries in reversed(saved):
        registry.entries.clear()
        registry.entries.update(entries)


def difference(what: str, found: Iterable[str], expected: Iterable[str]) -> list[str]:
    """One line if ``found`` differs from ``expected`` (as sets), naming what it lacks and what it has besides."""
    lacks, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if not lacks and not extra:
        return []
    return [f"{what}: lacks {lacks}, extra {extra}"]


# -- every kind: pyproject's entry points, the installed ones, and the plugins the packages define ----------------


def registries() -> dict[str, Any]:
    from alma_daemon import registry

    kinds = (
        registry.LEARNERS,
        registry.POLICIES,
        registry.MEASURES,
        registry.PUBLISHERS,
        registry.CODECS,
        registry.SOURCES,
        registry.COMMANDS,
    )
    return {kind.group: kind for kind in kinds}


def entry_point_problems() -> list[str]:
    """Each registry's names against pyproject.toml's entry points of its group (the installed metadata is
    stale until ``pip install -e .`` runs again), and every plugin loads (a declaration and the class it
    names agree)."""
    pyproject = tomllib.loads(text("pyproject.toml"))["project"]["entry-points"]
    problems = []
    for group, registry in registries().items():
        problems += difference(f"{group}, installed against pyproject.toml", registry, pyproject.get(group, {}))
        for name in registry:
            try:
                registry[name]
            except Exception as failed:  # any failure to load is a problem to report, with its words
                problems.append(f"{group} {name}: {failed}")
    return problems


def test_every_entry_point_is_installed_and_loads():
    assert entry_point_problems() == []


def test_an_entry_point_missing_from_the_installed_metadata_is_found(drop):
    from alma_daemon.registry import CODECS

    drop(CODECS, "regression")
    assert entry_point_problems() == [
        "alma_daemon.codecs, installed against pyproject.toml: lacks ['regression'], extra []"
    ]


def defined_plugins() -> dict[str, set[Any]]:
    """The plugins the project's packages define, by entry point group: each concrete learner, policy, measure,
    codec, publisher and source class, and each command module."""
    import alma_daemon.commands
    import alma_daemon.learners
    import alma_daemon.measures
    import alma_daemon.transports
    import policies
    import serving.protocols
    import serving.publishing
    from alma_daemon.learners.base import Learner
    from alma_daemon.measures import Measure
    from policies import Policy
    from serving.protocols.codecs import Codec
    from serving.publishing.publisher import Publisher

    def classes(package: Any, is_plugin: Any) -> set[type]:
        found = set()
        for module in pkgutil.iter_modules(package.__path__):
            loaded = importlib.import_module(f"{package.__name__}.{module.name}")
            found |= {
                c
                for c in vars(loaded).values()
                if isinstance(c, type) and c.__module__ == loaded.__name__ and is_plugin(c)
            }
        return found

    def concrete(base: type, mark: str) -> Any:
        return lambda c: issubclass(c, base) and mark in vars(c) and not inspect.isabstract(c)

    commands = alma_daemon.commands
    return {
        "alma_daemon.learners": classes(alma_daemon.learners, concrete(Learner, "name")),
        "alma_daemon.policies": classes(policies, concrete(Policy, "name")),
        "alma_daemon.measures": classes(alma_daemon.measures, concrete(Measure, "traits")),
        "alma_daemon.publishers": classes(serving.publishing, concrete(Publisher, "kind")),
        "alma_daemon.codecs": classes(serving.protocols, lambda c: issubclass(c, Codec) and not inspect.isabstract(c)),
        "alma_daemon.sources": classes(alma_daemon.transports, lambda c: "from_config" in vars(c)),
        "alma_daemon.commands": {
            importlib.import_module(f"{commands.__name__}.{m.name}") for m in pkgutil.iter_modules(commands.__path__)
        },
    }


def declared_plugins(registry: Any) -> set[Any]:
    """The objects a registry's entry points reach: a publisher's or source's ``from_config`` stands for its class."""
    return {getattr(registry[name], "__self__", registry[name]) for name in registry}


def undeclared_problems() -> list[str]:
    """Every plugin a package defines is reached by an entry point of its kind (one missing from pyproject.toml
    would be a class nothing can choose)."""
    problems = []
    kinds = registries()
    for group, defined in defined_plugins().items():
        missing = defined - declared_plugins(kinds[group])
        problems += [f"{group}: no entry point names {getattr(p, '__qualname__', p.__name__)}" for p in missing]
    return sorted(problems)


def test_every_plugin_the_packages_define_has_an_entry_point():
    assert undeclared_problems() == []


def test_a_plugin_without_an_entry_point_is_found(drop):
    from alma_daemon.registry import COMMANDS, POLICIES

    drop(POLICIES, "budget")
    drop(COMMANDS, "grid")
    assert undeclared_problems() == [
        "alma_daemon.commands: no entry point names alma_daemon.commands.grid",
        "alma_daemon.policies: no entry point names Budget",
    ]


# -- learners --------------------------------------------------------------------------------------------------------


def learner_problems() -> list[str]:
    """The learner registry against: the ``learner.name`` values the config accepts; the names ``learner.name``'s description lists; the README's list of learners
    (``switch-lm*`` stands for the family) and docs/results.md's."""
    from alma_daemon import learners

    names = set(learners.learner_names())
    problems = difference("learner.name accepts", accepted_plugin_names(LearnerConfig), names)
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


def test_the_learners_registry_config_and_docs_agree():
    assert learner_problems() == []


def test_a_learner_missing_from_the_registry_is_found(drop):
    from alma_daemon.registry import LEARNERS

    drop(LEARNERS, "firefly")
    problems = learner_problems()
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

    drop(policies.POLICIES, "budget")
    # The config reads its policies from the registry (the entry point): only the docs are left behind.
    assert policy_problems() == [
        "README.md's policies: lacks [], extra ['budget']",
        "docs/policies.md's sections: lacks [], extra ['budget']",
    ]


# -- measures --------------------------------------------------------------------------------------------------------

#: How docs/measures.md names the task kinds of a measure, as a measure's traits do.
DOC_KINDS = {
    "classification": ("binary", "multiclass"),
    "binary": ("binary",),
    "regression": ("regression",),
    "language models": ("language_model",),
}


def measure_problems() -> list[str]:
    """The measure registry (``MEASURES``) against: ``task.measure``'s accepted values (read from the entry
    points when the config is imported) and its description (which names each); docs/measures.md's "The
    measures" (each name, with its kinds and direction as the measure's declaration gives them)."""
    from alma_daemon.config.sections import TaskConfig
    from alma_daemon.measures import MEASURES

    names = set(MEASURES)
    problems = difference("task.measure accepts", accepted(TaskConfig, "measure"), names)
    description = field_description(TaskConfig, "measure")
    problems += [
        f"task.measure's description does not name {n}"
        for n in sorted(names)
        if not re.search(rf"\b{n}\b", description)
    ]
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
    from alma_daemon.config.measure_traits import MeasureTraits
    from alma_daemon.measures import MEASURES

    class Brier(MEASURES["mse"]):
        name = "brier"

    class MseUpsideDown(MEASURES["mse"]):
        traits = MeasureTraits("tests:MseUpsideDown", higher_is_better=True, kinds=("regression",))

    monkeypatch.setitem(MEASURES.entries, "mse", MseUpsideDown)
    MEASURES.register("brier", Brier)
    try:
        assert measure_problems() == [
            "task.measure accepts: lacks ['brier'], extra []",
            "task.measure's description does not name brier",
            "docs/measures.md's measures: lacks ['brier'], extra []",
            "docs/measures.md says mse is lower is better, for ('regression',)",
        ]
    finally:
        MEASURES.unregister("brier")


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
    of its own (its ``server`` is the transport's name; nothing connects at construction)."""
    import alma_daemon.transports as package

    problems = []
    config = build_config()
    for transport in sorted(transports):
        kafka = copy.copy(config.kafka)
        object.__setattr__(kafka, "transport", transport)  # a value the Literal does not hold, too
        try:
            source: Any = package.build_source(SimpleNamespace(kafka=kafka), client=object())
        except KeyError as unknown:
            problems.append(f"kafka.transport {transport}: {unknown.args[0]}")
            continue
        if source.server != transport:
            problems.append(f"kafka.transport {transport} builds a {type(source).__name__} ({source.server})")
    return problems


def test_every_transport_builds_its_own_source():
    from alma_daemon.config.sections import KafkaConfig

    assert source_problems(accepted(KafkaConfig, "transport")) == []


def test_a_transport_without_a_source_is_found(monkeypatch):
    from alma_daemon.config.sections import KafkaConfig
    from alma_daemon.transports import SOURCES
    from alma_daemon.transports.kafka import KafkaSource

    assert source_problems(accepted(KafkaConfig, "transport") | {"pulsar"}) == [
        "kafka.transport pulsar: unknown source 'pulsar'; known: kafka, redis"
    ]
    monkeypatch.setitem(SOURCES.entries, "redis", KafkaSource.from_config)
    assert source_problems({"redis"}) == ["kafka.transport redis builds a KafkaSource (kafka)"]


# -- commands --------------------------------------------------------------------------------------------------------


def command_problems() -> list[str]:
    """The command registry against the subcommands the parser has (each command module's, in the registry's
    order: a module's ``_`` is a ``-``), and the ``alma <command>`` the README, CONTRIBUTING.md and docs/
    mention (every subcommand, and none that is not one). The generic check above finds a module of
    alma_daemon/commands that no entry point names."""
    import argparse

    from alma_daemon import cli
    from alma_daemon.registry import COMMANDS

    problems = []
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if list(subcommands) != [name.replace("_", "-") for name in COMMANDS]:
        problems.append(f"the parser's subcommands {list(subcommands)} are not the registry's {list(COMMANDS)}")
    pages = ["README.md", "CONTRIBUTING.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
    mentioned = {name for page in pages for name in re.findall(r"(?:`|^)alma ([a-z][a-z_-]*)", text(page), re.M)}
    problems += difference("the docs' alma commands", mentioned, set(subcommands))
    return problems


def test_the_commands_parser_and_docs_agree():
    assert command_problems() == []


def test_a_command_missing_from_the_registry_is_found(drop):
    from alma_daemon.registry import COMMANDS

    drop(COMMANDS, "grid")
    assert command_problems() == ["the docs' alma commands: lacks [], extra ['grid']"]
