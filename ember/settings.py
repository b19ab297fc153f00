"""One description of each setting, read by every way of giving it.

A setting is a field of a config dataclass, declared with :func:`setting`: its
default and its help text. From that one field come

* its command-line flag (``--field-name``, or the flag given), via :func:`add_setting_flags`;
* its environment variable, which sets the flag's default: the class's ``ENV_PREFIX``
  (``EMBER_`` for shards, ``EMBER_CLIENT_`` for clients, ``EMBER_TRAIN_`` for trainers,
  so that no variable sets two sides) and the field's name in capitals;
* its key in a cluster file, checked by :func:`settings_from_mapping`, which
  names the key path of an unknown key or a value of the wrong type.

Fields declared without :func:`setting` (say, a trainer's endpoints) are given
by whoever builds the config, never by a flag, a variable or a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ember.env import PREFIX, env_value, parse_bool

T = TypeVar("T")

_HELP = "ember.help"
_FLAG = "ember.flag"
_CHOICES = "ember.choices"


class SettingsError(ValueError):
    """A key or value that a config file, a flag or a variable cannot give."""


def setting(
    default: Any, help: str, *, flag: str | None = None, choices: Sequence[str] | None = None
) -> Any:
    """A dataclass field that is a setting (see the module docstring).

    Args:
        default: its value when nothing gives one.
        help: what it does, as the flag's help says it.
        flag: its flag when not ``--field-name``.
        choices: the only values it may take, where they are few.
    """
    metadata = {_HELP: help, _FLAG: flag, _CHOICES: tuple(choices) if choices else None}
    return dataclasses.field(default=default, metadata=metadata)


def settings_of(cls: type) -> list[dataclasses.Field]:
    """The fields of ``cls`` declared with :func:`setting`, in declaration order."""
    return [f for f in dataclasses.fields(cls) if _HELP in f.metadata]


def env_prefix(cls: type) -> str:
    """The prefix of ``cls``'s environment variables (its ``ENV_PREFIX``, else ``EMBER_``)."""
    return getattr(cls, "ENV_PREFIX", PREFIX)


def env_name(cls: type, field: dataclasses.Field) -> str:
    """The environment variable of ``cls``'s setting ``field``."""
    return env_prefix(cls) + field.name.upper()


def settings_env_names(*classes: type) -> set[str]:
    """Every environment variable the settings of ``classes`` read."""
    return {env_name(cls, field) for cls in classes for field in settings_of(cls)}


def flag_of(field: dataclasses.Field) -> str:
    """The command-line flag of ``field``."""
    return field.metadata[_FLAG] or "--" + field.name.replace("_", "-")


def value_type(cls: type, field: dataclasses.Field) -> tuple[type, bool]:
    """The type of ``field``'s values, and whether it may be None (``X | None``)."""
    hint = typing.get_type_hints(cls)[field.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [m for m in typing.get_args(hint) if m is not type(None)]
        if len(members) != 1:
            raise TypeError(f"{cls.__name__}.{field.name}: a setting has one type, got {hint}")
        return members[0], True
    return hint, False


def add_setting_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add a flag for every setting of ``cls``; its environment variable sets its default.

    Raises:
        ValueError: a variable that does not parse as its setting's type.
    """
    for field in settings_of(cls):
        kind, _ = value_type(cls, field)
        parse = parse_bool if kind is bool else kind
        default = env_value(field.name, field.default, parse, prefix=env_prefix(cls))
        help_text = f"{field.metadata[_HELP]} (env {env_name(cls, field)})".replace("%", "%%")
        if kind is bool:
            parser.add_argument(
                flag_of(field),
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag_of(field),
                dest=field.name,
                type=kind,
                default=default,
                choices=field.metadata[_CHOICES],
                help=help_text,
            )


def settings_from_args(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A ``cls`` from the flags that :func:`add_setting_flags` added, plus the ``given`` fields."""
    values = {f.name: getattr(args, f.name) for f in settings_of(cls) if f.name not in given}
    return cls(**values, **given)


def settings_argv(config: Any, skip: Sequence[str] = (), always: Sequence[str] = ()) -> list[str]:
    """Flags that give every setting of ``config`` that differs from its default (and those
    in ``always`` even when not), but none in ``skip``."""
    argv: list[str] = []
    for field in settings_of(type(config)):
        value = getattr(config, field.name)
        if field.name in skip or (value == field.default and field.name not in always):
            continue
        if isinstance(value, bool):
            argv.append(flag_of(field) if value else "--no-" + flag_of(field)[2:])
        else:
            argv += [flag_of(field), str(value)]
    return argv


def settings_from_mapping(
    cls: type[T], table: Mapping[str, Any], path: str, skip: Sequence[str] = (), **given: Any
) -> T:
    """A ``cls`` from a cluster file's table: only its settings (but ``skip``), each of its type.

    Args:
        cls: the config dataclass.
        table: the file's table for it.
        path: the table's key path in the file, for messages (``"shard"``).
        skip: settings the file may not give (its launcher sets them).
        given: fields set by the caller.

    Raises:
        SettingsError: an unknown key or a value of the wrong type, naming its key path.
    """
    known = {f.name: f for f in settings_of(cls) if f.name not in skip and f.name not in given}
    values: dict[str, Any] = {}
    for key, value in table.items():
        where = f"{path}.{key}" if path else key
        if key not in known:
            raise SettingsError(f"{where}: unknown key (known: {', '.join(sorted(known))})")
        values[key] = _checked_value(cls, known[key], value, where)
    return cls(**values, **given)


def _checked_value(cls: type, field: dataclasses.Field, value: Any, where: str) -> Any:
    kind, optional = value_type(cls, field)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = kind.__name__ + (" or nothing" if optional else "")
        raise SettingsError(f"{where}: expected {expected}, got {type(value).__name__} {value!r}")
    choices = field.metadata[_CHOICES]
    if choices and value not in choices:
        raise SettingsError(f"{where}: must be one of {', '.join(choices)}, got {value!r}")
    return value
