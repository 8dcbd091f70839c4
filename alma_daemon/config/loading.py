"""Reading a config: YAML files, ``--set key=value`` overrides, and the JSON Schema editors check files with.

YAML files and overrides are merged into a plain dict, then validated into :class:`Config` in one go,
so that an unknown key or a bad value fails at start-up, naming the dotted key, not an hour in.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import TypeAdapter

from alma_daemon.config.base import ConfigError, KeyOfAnotherPlugin, validate
from alma_daemon.config.masking import mask_secrets
from alma_daemon.config.plugins import LearnerConfig, PolicyConfig
from alma_daemon.config.sections import MODEL_STORE, Config

log = logging.getLogger(__name__)


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but numbers in scientific notation are numbers.

    PyYAML follows YAML 1.1, where ``1e-3`` and ``1.0e15`` are strings (only ``1.0e+15`` is a float), so
    ``train.lr: 1e-3`` failed with "must be a number"; YAML 1.2, and every user, reads them as floats.
    """


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _load_yaml(text: Any) -> Any:
    """Parse YAML text or an open file, data only (never code): the loader is a SafeLoader, which
    constructs no Python object from a tag (tests/test_config.py checks)."""
    return yaml.load(text, Loader=_ConfigLoader)


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key=value``; the value is parsed as YAML so ``true``, ``16`` and ``[1, 2]`` get their types."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. learner.width=16")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        return key, _load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: not valid YAML: {' '.join(str(exc).split())}") from None


def set_dotted(data: dict, key: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for key ``a.b``, creating intermediate mappings."""
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping (safe loader only: config files are data, never code)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    with path.open() as f:
        try:
            data = _load_yaml(f) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def build_config(
    data: dict | None = None, overrides: list[str] | tuple[str, ...] = (), file: str | Path | None = None
) -> Config:
    """Merge ``overrides`` (``key=value``) into ``data`` (read from ``file``, if given: errors say
    which keys were set there) and validate the result."""
    merged = copy.deepcopy(data or {})
    overridden = set()
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(merged, key, value)
        overridden.add(key)
    for kind in (LearnerConfig, PolicyConfig):
        _switch_plugin(merged, kind, overridden)
    _derive_daemon_folders(merged, file)
    try:
        return cast(Config, validate(Config, merged))
    except KeyOfAnotherPlugin as exc:
        raise exc.where_set(None if file is None else str(file), overridden) from None


def default_state_dir(file: str | Path | None, redis_url: Any) -> str:
    """``daemon.state_dir`` when neither the file nor ``--set`` gives it: one folder per config file and
    per Redis kind, so that two configs (or one config with and without ``--embedded``) never share a
    model store or a status file: ``runs/<file name>``, ``runs/<file name>-embedded`` for the embedded
    Redis (``redis.url`` unset); without a file ``runs/embedded``, or ``runs/daemon`` with a redis.url."""
    embedded = not redis_url
    if file is None:
        return "runs/embedded" if embedded else "runs/daemon"
    name = Path(file).stem
    return f"runs/{name}-embedded" if embedded else f"runs/{name}"


def default_stream_name(dataset: Any) -> str:
    """``daemon.stream`` when neither the file nor ``--set`` gives it: a name from the dataset, so that
    ``alma status`` of a team's history does not say mnist. A registered dataset's name; a River stream's
    ``river-<stream>``; a table's or arrays' first file's name without its endings."""
    dataset = dataset if isinstance(dataset, dict) else {}
    name = dataset.get("name", "mnist")
    files = dataset.get("files")
    first = files[0] if isinstance(files, list) and files else files
    if name == "river":
        name = f"river-{dataset.get('river_stream', 'agrawal')}"
    elif name in ("table", "arrays") and isinstance(first, str):
        name = Path(first).name.split(".")[0]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip("-._")[:64]
    return name or "stream"


def _derive_daemon_folders(merged: dict, file: str | Path | None) -> None:
    """Fill in ``daemon.state_dir`` (:func:`default_state_dir`), ``daemon.checkpoint_dir``
    (``<state_dir>/model_store``) and ``daemon.stream`` (:func:`default_stream_name`) where neither the
    file nor an override set them."""
    daemon = merged.setdefault("daemon", {})
    redis = merged.get("redis")
    if not isinstance(daemon, dict) or not (redis is None or isinstance(redis, dict)):
        return  # validation names the section that is not a mapping
    if daemon.get("stream") is None:
        daemon["stream"] = default_stream_name(merged.get("dataset"))
    if daemon.get("state_dir") is None:
        daemon["state_dir"] = default_state_dir(file, (redis or {}).get("url"))
    if daemon.get("checkpoint_dir") is None and isinstance(daemon["state_dir"], str):
        daemon["checkpoint_dir"] = str(Path(daemon["state_dir"]) / MODEL_STORE)


def _switch_plugin(merged: dict, kind: type[LearnerConfig] | type[PolicyConfig], overridden: set[str]) -> None:
    """``--set learner.name=X`` (or ``policy.name``) switches the plugin of a config read from a file:
    drop the file's keys of that section that X does not read (those of the plugin it named), logging
    one line. Keys given with --set themselves stay, so that one X does not read still fails."""
    section = kind.section
    values = merged.get(section)
    if f"{section}.name" not in overridden or not isinstance(values, dict):
        return
    name = values.get("name")
    models = kind.registered()
    if not isinstance(name, str) or name not in models:
        return  # validation refuses it, naming the known plugins
    reads = {f.name for f in dataclasses.fields(models[name])}
    dropped = [k for k in values if k not in reads and not _set_by(f"{section}.{k}", overridden)]
    for key in dropped:
        del values[key]
    if dropped:
        keys = ", ".join(f"{section}.{k}" for k in dropped)
        log.warning(
            "config: %s.name=%s from --set: dropped %s (%s does not read %s)",
            section,
            name,
            keys,
            name,
            "it" if len(dropped) == 1 else "them",
        )


def _set_by(key: str, overridden: set[str]) -> bool:
    """Whether one of the ``overridden`` keys sets ``key`` (itself, or a section holding it)."""
    return any(key == k or key.startswith(f"{k}.") for k in overridden)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``path`` (or the defaults when None), apply ``--set`` overrides, validate."""
    return build_config(read_yaml(path) if path else {}, overrides, path)


def to_dict(config: Any) -> dict:
    """The resolved config as plain data, as saved next to every run's results: a password written in
    a URL is masked (secrets come from files; alma_daemon/infra/credentials.py)."""
    return mask_secrets(dataclasses.asdict(config))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config file: every section, and each learner's and policy's own keys."""
    schema = TypeAdapter(Config).json_schema()
    schema["title"] = "alma-daemon config"
    return schema
