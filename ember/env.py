"""The one place that reads EMBER_* environment variables.

Every CLI flag and config field that deployments set from the environment
goes through :func:`env_value`, so the variable names are discoverable here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PREFIX = "EMBER_"


def env_value(
    name: str, default: T, parse: Callable[[str], T] | None = None, prefix: str = PREFIX
) -> T:
    """The value of ``<prefix><NAME>`` (``EMBER_<NAME>``) parsed like ``default``, or ``default``
    if unset.

    Example:
        >>> env_value("PORT", 50051)  # reads EMBER_PORT
        50051
    """
    variable = prefix + name.upper()
    raw = os.environ.get(variable)
    if raw is None or raw == "":
        return default
    parser = parse or (parse_bool if isinstance(default, bool) else type(default))
    try:
        return parser(raw)
    except ValueError as error:
        raise ValueError(f"{variable}={raw!r} is not a valid value: {error}") from None


def parse_bool(raw: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); ValueError otherwise."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected one of 1, true, yes, on, 0, false, no, off")
