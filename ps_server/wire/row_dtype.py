"""How a table's rows and gradients travel in step messages: float32, float16 or bfloat16.

The names and numbers only (no torch): packing is :mod:`row_packing`'s.
"""

from __future__ import annotations

import enum

from ember.ps_server.errors import InvalidArgumentError


class RowDtype(enum.IntEnum):
    """A table's rows on the wire; values are the .proto's ``RowDtype`` numbers (a test
    checks them against the generated code)."""

    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2

    @property
    def itemsize(self) -> int:
        """Bytes of one element."""
        return 4 if self is RowDtype.FLOAT32 else 2

    @classmethod
    def parse(cls, name: str) -> RowDtype:
        """``float32``, ``float16`` or ``bfloat16`` (as torch names them).

        Raises:
            ValueError: any other name.
        """
        try:
            return cls[name.upper()]
        except KeyError:
            names = ", ".join(d.name.lower() for d in cls)
            raise ValueError(f"row dtype must be one of {names}, got {name!r}") from None

    @classmethod
    def from_wire(cls, number: int) -> RowDtype:
        """A message's dtype field.

        Raises:
            InvalidArgumentError: a number the .proto does not define.
        """
        try:
            return cls(number)
        except ValueError:
            raise InvalidArgumentError(
                f"unknown row dtype {number}; the wire carries "
                + ", ".join(f"{d.value} ({d.name.lower()})" for d in cls)
            ) from None
