"""HashedInit: a table's initial rows in the form the native ops make them themselves."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class HashedInit:
    """Initial weights the native op makes itself: hashed-uniform in ``[-scale, scale)``
    keyed by the table's name salt and the seed's key (``ember.ps_server.shard.initializers``'
    rule), or zeros where not ``uniform``."""

    uniform: bool
    name_salt: int = 0
    seed_key: int = 0
    scale: float = 0.0
