"""How each setting's raw value (text from the environment or a flag, or a TOML value) becomes a typed one.

Each parser returns the value or raises ValueError with the "allowed" half of the one-line error
(pipeline/config.py adds the key's name and where the value came from).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable

EMBEDDED = "embedded"  # pulsar.service_url: start pulsar-lite on 127.0.0.1 instead of using a broker

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
MAX_DURATION_S = 7 * 24 * 3600.0  # a week: longer waits and intervals are mistakes, and overflow Spark's ms
_DURATION_ALLOWED = "a duration from 0 to 7 days such as '10s', '500ms' or '2m'"


def parse_duration(raw: Any) -> float:
    """Seconds from ``"10s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a bare number of seconds."""
    if isinstance(raw, bool):
        raise ValueError(_DURATION_ALLOWED)
    if isinstance(raw, (int, float)):
        seconds = float(raw) if not isinstance(raw, int) or abs(raw) <= 2**63 else math.inf
    else:
        match = _DURATION.fullmatch(str(raw))
        if not match:
            raise ValueError(_DURATION_ALLOWED)
        number, unit = float(match.group(1)), match.group(2) or "s"
        seconds = number * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION_S:  # inf, nan, 1e308, negatives
        raise ValueError(_DURATION_ALLOWED)
    return seconds


def int_at_least(minimum: int, maximum: int = 2**31 - 1) -> Callable[[Any], int]:
    """Whole numbers from ``minimum`` to ``maximum`` (by default the largest int Spark's settings take)."""
    allowed = f"a whole number from {minimum} to {maximum}"

    def parse(raw: Any) -> int:
        try:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except (ValueError, OverflowError):
            raise ValueError(allowed) from None
        if not minimum <= value <= maximum:
            raise ValueError(allowed)
        return value

    return parse


def text(raw: Any) -> str:
    value = str(raw).strip()
    if not value:
        raise ValueError("a non-empty text")
    return value


def folder(raw: Any) -> str:
    if not isinstance(raw, (str, os.PathLike)):
        raise ValueError("a folder path as text, such as './var'")
    value = text(os.fspath(raw))
    if "\0" in value:
        raise ValueError("a folder path without NUL characters, such as './var'")
    return value


def optional_text(raw: Any) -> str | None:
    value = str(raw).strip() if raw is not None else ""
    return value or None


def service_url(raw: Any) -> str:
    value = text(raw)
    if value != EMBEDDED and not re.match(r"^pulsar(\+ssl)?://[^\s/]+", value):
        raise ValueError("'embedded' or a URL like 'pulsar://host:6650'")
    return value


def admin_url(raw: Any) -> str | None:
    value = optional_text(raw)
    if value is not None and not re.match(r"^https?://[^\s/]+", value):
        raise ValueError("empty or a URL like 'http://host:8080'")
    return value


def topic(raw: Any) -> str:
    value = text(raw)
    if not re.match(r"^(persistent|non-persistent)://[^/\s]+/[^/\s]+/[^/\s]+$", value):
        raise ValueError("a full topic name like 'persistent://public/default/users'")
    return value


def spark_master(raw: Any) -> str:
    value = text(raw)
    if not re.match(r"^(local(\[(\*|\d+)\])?|spark://\S+|yarn|k8s://\S+)$", value):
        raise ValueError("'local[*]', 'local[N]', 'spark://host:7077', 'yarn' or 'k8s://…'")
    return value


def heap_size(raw: Any) -> str:
    value = text(raw).lower()
    match = re.match(r"^(\d+)([mg])$", value)
    # Spark refuses a driver heap under about 450 MB (its reserved 300 MB and 1.5 times that).
    if not match or int(match[1]) * (1024 if match[2] == "g" else 1) < 512:
        raise ValueError("a JVM heap size of at least 512 MB such as '1g' or '1536m'")
    return value


_BYTES = re.compile(r"^\s*(\d+)\s*(b|kb|mb|gb)?\s*$")
_BYTE_UNITS = {None: 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


def byte_size(raw: Any) -> int:
    """A size such as '128MB', '512kb' or a whole number of bytes, from 1 MB to 64 GB."""
    match = _BYTES.match(str(raw).lower())
    value = int(match[1]) * _BYTE_UNITS[match[2]] if match else 0
    if not (1 << 20) <= value <= (64 << 30):
        raise ValueError("a size from 1MB to 64GB such as '128MB' or '1GB'")
    return value


def choice(*allowed: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        value = str(raw).strip()
        if value not in allowed:
            raise ValueError("one of " + ", ".join(repr(a) for a in allowed))
        return value

    return parse


def port(raw: Any) -> int:
    try:
        return int_at_least(1, 65535)(raw)
    except ValueError:
        raise ValueError("a port number from 1 to 65535") from None


def positive_duration(raw: Any) -> float:
    value = parse_duration(raw)
    if value <= 0:
        raise ValueError("a duration > 0 such as '1s' or '500ms'")
    return value
