"""What every config model is built from: strict value types, plugin sections, and errors that name the key.

Config models are pydantic dataclasses (``@dataclass(config=SECTION)``): validated on construction,
including ``dataclasses.replace``, and plain dataclasses to the rest of the code (``asdict``, equality).
:func:`validate` turns pydantic's errors into one :class:`ConfigError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, ClassVar, TypeGuard, TypeVar

from pydantic import ConfigDict, Field, GetJsonSchemaHandler, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; the message names the key."""


#: Plugin sections by the plural their error messages use.
PLURAL = {"learner": "learners", "policy": "policies"}


class KeyOfAnotherPlugin(ConfigError):
    """A key that the chosen plugin of its section does not read, though others do (``learner.members``
    with learner ``sm``). What to do about it depends on where the key and the plugin's name were set:
    :meth:`where_set` words the message after that, once the loader knows."""

    def __init__(self, key: str, section: str, name: str, readers: list[str], file: str | None = None):
        self.key, self.section, self.name, self.readers = key, section, name, readers
        where = f" (set in {file})" if file else ""
        super().__init__(
            f"{key}: not read by the {name!r} {section}{where}; the {PLURAL[section]} that read it: {', '.join(readers)}"
        )

    def where_set(self, file: str | None, overridden: set[str]) -> ConfigError:
        """This error, worded for a config read from ``file`` with ``--set`` overrides of the keys
        ``overridden``: the file is named when the key was set there. (A ``name`` chosen with --set drops
        the file's keys that plugin does not read before validation: alma_daemon/config/loading.py.)"""
        key_in_file = file is not None and not _set_by(self.key, overridden)
        return KeyOfAnotherPlugin(self.key, self.section, self.name, self.readers, file if key_in_file else None)


def _set_by(key: str, overridden: set[str]) -> bool:
    """Whether one of the ``overridden`` keys sets ``key`` (itself, or a section holding it)."""
    return any(key == k or key.startswith(f"{k}.") for k in overridden)


#: Every section refuses keys it does not declare.
SECTION = ConfigDict(extra="forbid")


def _name_required_unless_default(schema: dict[str, Any], model: Any) -> None:
    # Without it, an editor could not tell which plugin a section without ``name`` is: every plugin whose
    # keys fit would match. alma takes the kind's default plugin then, the one model whose name is optional.
    name = schema.get("properties", {}).get("name", {})
    if "const" in name and name["const"] != getattr(model, "default_name", None):
        schema["required"] = ["name"]


#: A plugin's section: as SECTION; its JSON Schema requires ``name`` except for the default plugin.
PLUGIN_SECTION = ConfigDict(extra="forbid", json_schema_extra=_name_required_unless_default)

# Values are taken as written: "16" is not an integer and 1 is not true (YAML already types them).
Int = Annotated[int, Field(strict=True)]
#: An integer is a number, a boolean is not; YAML's .inf and .nan are not values of any key.
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]
Str = Annotated[str, Field(strict=True)]


_Kind = TypeVar("_Kind", bound="PluginConfig")


@dataclass(config=PLUGIN_SECTION)
class PluginConfig:
    """A section whose keys depend on its ``name`` (``learner``, ``policy``): one subclass per plugin.

    A subclass narrows ``name`` to its plugin's name (``name: Literal["sm"] = "sm"``) and adds the keys
    that plugin reads; a key of another plugin is refused, naming the plugin.
    """

    name: Str = ""

    #: The section's key in the config ("learner") and the plugin ``name`` taken when none is given.
    section: ClassVar[str]
    default_name: ClassVar[str]

    @classmethod
    def registered(cls) -> dict[str, type[PluginConfig]]:
        """The config model of each registered plugin of this kind, by name."""
        raise NotImplementedError

    @classmethod
    def model_for(cls, name: str) -> type[PluginConfig]:
        models = cls.registered()
        if name not in models:
            raise ConfigError(f"{cls.section}.name: unknown {cls.section} {name!r}; known: {', '.join(sorted(models))}")
        return models[name]

    @classmethod
    def default(cls: type[_Kind]) -> _Kind:
        """The default plugin's model with its defaults."""
        return cls.choose({})

    @classmethod
    def choose(cls, value: Any) -> Any:
        """The section as the named plugin's model (a mapping without ``name`` gets the default plugin)."""
        if isinstance(value, PluginConfig) or not isinstance(value, dict | type(None)):
            return value
        data = {"name": cls.default_name, **(value or {})}
        if isinstance(data["name"], str):
            cls.model_for(data["name"])  # an unknown name fails here, listing the known ones
        return TypeAdapter(plugin_union(cls)).validate_python(data)


def plugin_union(base: type[PluginConfig]) -> Any:
    """The registered models of ``base``'s kind as one union, discriminated by ``name``."""
    models = tuple(base.registered().values())
    return Annotated[typing.Union[models], Field(discriminator="name")]  # noqa: UP007 (a runtime tuple of types)


class UnionSchema:
    """Annotation giving a plugin section the JSON Schema of its kind's union, built when the schema is asked
    for (the plugins register on import, after this package is loaded)."""

    def __init__(self, base: type[PluginConfig]):
        self.base = base

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: GetJsonSchemaHandler) -> Any:
        return handler(TypeAdapter(plugin_union(self.base)).core_schema)


def validate(cls: type, data: Any, prefix: str = "") -> Any:
    """Build config model ``cls`` from plain ``data``; any problem raises a ConfigError naming its dotted key."""
    if data is None:
        data = {}
    try:
        if _is_kind(cls):
            return cls.choose(data)  # a kind's base class: the model named in the data
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as exc:
        raise _error(exc.errors()[0], cls, prefix) from None


def _error(error: Any, root: type, prefix: str) -> ConfigError:
    """One pydantic error as ``key: what is wrong; got value``, in the words config users read."""
    holder, names, plugin = _walk(root, error["loc"])
    key = prefix + ".".join(names)
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "value_error" and isinstance(ctx.get("error"), ConfigError):
        return ctx["error"]
    if kind == "value_error":
        got = "" if isinstance(value, dict) else f"; got {value!r}"
        return ConfigError(f"{key}: {ctx.get('error', error['msg'])}{got}")
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        readers = [] if plugin is None else sorted(n for n, m in plugin.registered().items() if names[-1] in _keys(m))
        if readers:
            return KeyOfAnotherPlugin(key, plugin.section, str(_keys(plugin)["name"].default), readers)
        return ConfigError(f"unknown config key '{key}' (known keys here: {', '.join(sorted(_keys(holder)))})")
    if kind == "union_tag_invalid":
        return ConfigError(f"{key}.name: unknown value {ctx.get('tag')}; known: {ctx.get('expected_tags')}")
    if kind == "literal_error":
        return ConfigError(f"{key}: must be one of {ctx['expected'].replace(' or ', ', ')}; got {value!r}")
    words = {
        "greater_than": f"must be > {ctx.get('gt')}",
        "greater_than_equal": f"must be >= {ctx.get('ge')}",
        "less_than_equal": f"must be <= {ctx.get('le')}",
        "int_type": "must be an integer",
        "float_type": "must be a number",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dataclass_type": "must be a mapping",
        "dict_type": "must be a mapping",
    }
    return ConfigError(f"{key or 'config'}: {words.get(kind, error['msg'])}; got {value!r}")


def _is_kind(model: Any) -> TypeGuard[type[PluginConfig]]:
    """Whether ``model`` is the base of a plugin kind (LearnerConfig), not one plugin's model."""
    return isinstance(model, type) and issubclass(model, PluginConfig) and "section" in model.__dict__


def _walk(root: type, loc: tuple) -> tuple[Any, list[str], Any]:
    """Follow an error location from model ``root``: the model holding the last key, the key names, and
    the plugin model the location runs through (None outside plugin sections)."""
    model: Any = root
    holder: Any = root
    names: list[str] = []
    plugin: Any = None
    for part in map(str, loc):
        if _is_kind(model) and part in model.registered():
            plugin = model = model.registered()[part]  # the union's tag: not a key
            continue
        holder = model
        names.append(part)
        model = _field_type(model, part)
    return holder, names, plugin


def _keys(model: Any) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(model)} if dataclasses.is_dataclass(model) else {}


def _field_type(model: Any, name: str) -> Any:
    if not (isinstance(model, type) and dataclasses.is_dataclass(model)):
        return None
    hint = typing.get_type_hints(model, include_extras=True).get(name)
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((a for a in typing.get_args(hint) if a is not type(None)), None)
    return hint
