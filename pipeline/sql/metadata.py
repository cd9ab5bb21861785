"""METADATA columns: which message metadata a table's rows carry, its types, and reading it (pure).

Flink's upsert-pulsar declares them as ``col TYPE METADATA [FROM 'key'] [VIRTUAL]`` (the key is
the column's name unless FROM names it). The source (pipeline/source/reader.py) reads these of
each message, so a query without GROUP BY may read them in its SELECT and WHERE
(pipeline/sql/plan.py):

- ``eventTime``, ``publishTime``: TIMESTAMP(3) (or TIMESTAMP_LTZ(3)), UTC; ``eventTime`` is NULL
  when the producer set none (Pulsar's 0);
- ``properties``: MAP<STRING, STRING>, read as ``properties['name']``;
- ``topic``, ``key``: STRING.

``sequenceId`` and ``messageId`` may be declared (the seed's tables do) but not read: the source
does not carry them.
"""

from __future__ import annotations

import json

# key -> (its Spark type, the declared types that fit it)
METADATA_KEYS = {
    "eventTime": ("timestamp", ("TIMESTAMP", "TIMESTAMP_LTZ")),
    "publishTime": ("timestamp", ("TIMESTAMP", "TIMESTAMP_LTZ")),
    "properties": ("map<string,string>", ("MAP<STRING, STRING>",)),
    "topic": ("string", ("STRING", "VARCHAR")),
    "key": ("string", ("STRING", "VARCHAR")),
}
METADATA_READ = "METADATA columns are read in the SELECT and WHERE of a query without GROUP BY"


def metadata_problem(key: str, sql_type: str) -> str | None:
    """Why a METADATA column of ``key`` declared ``sql_type`` cannot be read (None: it can): a key
    the source does not read, or a declared type that does not fit the key's."""
    if key not in METADATA_KEYS:
        return f"METADATA {key!r}, which this source does not read; supported: {', '.join(METADATA_KEYS)}"
    declared = METADATA_KEYS[key][1]
    if sql_type.upper() not in declared:
        return f"METADATA {key!r} declared {sql_type}; supported: {' or '.join(declared)}"
    return None


def metadata_values(fields: dict[str, str], row: dict) -> dict:
    """{envelope field: value} of the METADATA columns a query reads (``fields``: envelope field ->
    key), from one source row. Runs on the executors, in the parse step (pipeline/sql/envelope.py).

    # row: {"topic": "persistent://…/users", "key": "u1", "event_time": 1700000000100,
    #       "publish_time": datetime(…), "properties": '{"tier": "gold"}', …}
    # -> {"s0_eventTime": datetime(2023, 11, 14, 22, 13, 20, 100000, UTC), "s0_properties": [("tier", "gold")]}
    """
    from datetime import datetime, timedelta, timezone

    values = {}
    for field, key in fields.items():
        if key == "eventTime":
            ms = row.get("event_time")  # whole milliseconds: no float rounding of .123 to .122999
            values[field] = None if ms is None else datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
        elif key == "publishTime":
            values[field] = row.get("publish_time")
        elif key == "properties":
            # the source's sorted JSON of the message's properties (None: it has none)
            values[field] = sorted(json.loads(row["properties"]).items()) if row.get("properties") else []
        else:  # topic, key
            values[field] = row.get(key)
    return values
