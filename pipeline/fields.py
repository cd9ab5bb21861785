"""The description of one wire field: its name, type, whether it is required, and its default.

Its own module so that both :mod:`pipeline.wire` (which validates records) and
:mod:`pipeline.enrich.lookups` (which declares each changelog's fields) use it, and the wire
format can be derived from the lookups without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NONE = -1  # the Java model's "no time" / "no parent" marker


@dataclass(frozen=True)
class Field:
    name: str
    kind: type  # int, float or str
    required: bool
    default: Any = None
    time: bool = False  # epoch milliseconds, within wire.MIN_TIME_MS..MAX_TIME_MS
