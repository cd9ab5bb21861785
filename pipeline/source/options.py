"""The source's options (datasource.py's docstring lists them), each checked on the driver in one line.

A bad option fails the query before it starts, with its name and value, never a read task.
"""

from __future__ import annotations

import importlib
import json

from pipeline.errors import SourceError
from pipeline.source.offsets import EARLIEST


def parse_topics_option(text: str | None) -> dict[str, str]:
    """``kind=topic,…`` -> {kind: topic}; checked on the driver."""
    if not text:
        raise SourceError("option 'topics' is required, e.g. 'orders=persistent://public/default/orders'")
    topics = {}
    for pair in text.split(","):
        kind, sep, topic = pair.strip().partition("=")
        if not sep or not kind or "://" not in topic:
            raise SourceError(f"option 'topics' entry {pair!r} is not of the form kind=persistent://tenant/ns/topic")
        topics[kind.strip()] = topic.strip()
    return topics


def parse_starting_offsets(text: str | None, kinds: list[str]) -> dict[str, str]:
    if not text or text == EARLIEST:
        return {kind: EARLIEST for kind in kinds}
    if text == "latest":
        return {kind: "latest" for kind in kinds}
    try:
        given = json.loads(text)
    except ValueError:
        raise SourceError(f"option 'startingOffsets' = {text!r} is not 'earliest', 'latest' or a JSON object") from None
    bad = {k: v for k, v in given.items() if k not in kinds or v not in (EARLIEST, "latest")}
    if bad:
        raise SourceError(f"option 'startingOffsets' has bad entries {bad!r}; keys are {kinds}, values earliest|latest")
    return {kind: given.get(kind, EARLIEST) for kind in kinds}


def load_transform(spec: str | None, args_json: str | None = None):
    """The ``transform`` option (``module:function``, arguments as JSON) as a function of Arrow
    batches, or None without one; checked on the driver, loaded again in each read task."""
    if not spec:
        return None
    module_name, sep, function_name = spec.partition(":")
    try:
        args = json.loads(args_json) if args_json else {}
    except ValueError:
        raise SourceError(f"option 'transformArgs' = {args_json!r} is not a JSON object") from None
    if not sep or not isinstance(args, dict):
        raise SourceError(f"option 'transform' = {spec!r} must be module:function, with 'transformArgs' a JSON object")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise SourceError(f"option 'transform' = {spec!r} cannot be loaded: {exc}") from None
    return (lambda batches: function(batches, **args)) if args else function


def whole_number(options: dict, name: str, minimum: int = 1) -> int | None:
    """A whole-number option (None when absent, empty or 0 for the caps), checked in one line."""
    raw = options.get(name)
    if raw in (None, "") or (raw in ("0", 0) and minimum > 0):
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise SourceError(f"option {name!r} = {raw!r} is not a whole number") from None
    if value < minimum:
        raise SourceError(f"option {name!r} = {raw!r} must be >= {minimum}")
    return value
