"""Control actions shared by the CLI and the console: savepoints, replay, re-drive, state look-up.

The CLI (pipeline/cli.py) and the console (through ``app/views.load_control``) call these, so
both act the same way. Savepoints and restores live in pipeline/control/savepoints.py and the job lock
in pipeline/control/lock.py; they are re-exported here as part of that one surface.

- A **replay** request is a file the running job's source picks up (see pipeline/source/offsets.py).
- A **re-drive** republishes missing-state orders with a ``redrive-of`` property, each order at
  most once, skipping rows already re-driven and orders enriched since (:func:`plan_redrive`).
- A **state look-up** is served by one long-lived worker process (pipeline/control/state_service.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pipeline import store, wire
from pipeline.config import Settings
from pipeline.enrich.lookups import CHANGELOGS, LOOKUPS, MISSING_REASONS
from pipeline.enrich.rules import RECORD_COLUMNS, REDRIVE_PROPERTY
from pipeline.errors import ControlError
from pipeline.control.lock import JobLock, acquire_job_lock, file_lock, job_is_running  # noqa: F401 - the control surface
from pipeline.metrics import MetricsStore, iso, now_ms, read_rows
from pipeline.sinks import RENAMED
from pipeline.control.savepoints import (  # noqa: F401 - the control surface
    SavepointInfo, check_name, list_savepoints, recover_restore, restore_savepoint, take_savepoint)


# ---------------------------------------------------------------------------- replay
def _parse_time(value: str | datetime) -> int:
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise ControlError(f"time {value!r} is not an ISO time like 2026-11-22T10:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    allowed = "a time from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z"
    try:
        ms = int(moment.timestamp() * 1000)
        iso(ms)  # the request records it as an ISO time
    except (OverflowError, ValueError, OSError):
        raise ControlError(f"time {value!r} is out of range; give {allowed}") from None
    if not 0 <= ms <= _LAST_MS:
        raise ControlError(f"time {value!r} is out of range; give {allowed}")
    return ms


_LAST_MS = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp() * 1000)


def request_replay(settings: Settings, topic: str, from_time: str | datetime | None = None,
                   requested_by: str = "console") -> dict:
    """Ask the running job to re-read a changelog topic from its start (or from a time)."""
    if topic not in CHANGELOGS:
        raise ControlError(f"replay topic {topic!r} is not a changelog; choose "
                           f"{' or '.join(repr(name) for name in CHANGELOGS)}")
    from_ms = None if from_time in (None, "", "earliest") else _parse_time(from_time)
    store.ensure_data_dir(settings.data_dir)
    folder = store.replay_requests_dir(settings.data_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Numbered under a lock, so two requests at once never get the same number; a request
        # file is renamed into place before the lock drops, so the next one sees it.
        with file_lock(folder / ".seq.lock"):
            seqs = [int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()]
            seq = max(seqs, default=0) + 1
            request = {"seq": seq, "topic": topic, "from": "earliest" if from_ms is None else iso(from_ms),
                       "from_ms": from_ms, "requested_at": iso(now_ms()), "requested_by": requested_by}
            store.replace_file(folder / f"{seq:08d}.json", json.dumps(request))
    except OSError as exc:
        raise ControlError(f"cannot write the replay request under {str(folder)!r}: {exc.strerror or exc}") from exc
    MetricsStore(settings.data_dir).event("replay_requested", f"replay #{seq} of {topic} from {request['from']} "
                                          f"requested by {requested_by}", seq=seq, topic=topic,
                                          requested_by=requested_by, **{"from": request["from"]})
    return request


# ---------------------------------------------------------------------------- re-drive
# Why a matching missing-state row is not republished (RedrivePlan.skipped).
SKIP_REDRIVEN = "already re-driven"  # a later row (or a re-drive not read back yet) points at it
SKIP_ENRICHED = "enriched since"  # the order has an enriched row: republishing it would add another
SKIP_DUPLICATE = "older row of an order with a newer one"  # e.g. two re-drives of one row


@dataclass
class RedrivePlan:
    """What a re-drive request does: the rows it republishes (one per order line, the newest row
    not re-driven yet) and, per reason, how many matching rows it skips."""

    rows: list[dict] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.rows)

    def describe(self) -> str:
        """One line for a person: ``2 order line(s) will be republished; 3 skipped: 2 already re-driven, …``."""
        line = f"{self.count} order line(s) will be republished"
        if self.skipped:
            line += f"; {sum(self.skipped.values())} skipped: " + ", ".join(f"{n} {why}" for why, n in self.skipped.items())
        return line


def _key_ids(user_id=None, item_id=None, **ids) -> dict[str, int | None]:
    """A selector's id per lookup (by its id column, ``user_id``…), in LOOKUPS order."""
    given = {"user_id": user_id, "item_id": item_id, **ids}
    unknown = set(given) - {lookup.id_column for lookup in LOOKUPS}
    if unknown:
        raise ControlError(f"unknown selector {sorted(unknown)!r}; expected invoice_ids, reason or one of "
                           f"{[lookup.id_column for lookup in LOOKUPS]}")
    return {lookup.id_column: given.get(lookup.id_column) for lookup in LOOKUPS}


def find_missing(settings: Settings, invoice_ids=None, reason=None, **ids) -> list[dict]:
    """Missing-state rows matching the selector (all of its given parts: invoice ids, a reason,
    an id per lookup by its id column), oldest first."""
    where, params = [], []
    if invoice_ids:
        where.append(f"invoice_id IN ({', '.join('?' for _ in invoice_ids)})")
        params += [int(i) for i in invoice_ids]
    for column, value in (*_key_ids(**ids).items(), ("reason", reason)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    return _read_sink(settings, "missing_state", f"SELECT * FROM read_parquet(?) WHERE {' AND '.join(where) or 'TRUE'} "
                      "ORDER BY detected_at", params)


def _read_sink(settings: Settings, sink: str, sql: str, params: list) -> list[dict]:
    """``sql`` (its first ``?`` the sink's files) over the files of the sink's table now, as dicts.

    The Delta log's list, not a glob: compacted files stay on disk until vacuum. A vacuum may
    remove a listed file a moment later, so a read that finds one gone lists them again."""
    import duckdb

    from pipeline.sinks import sink_files

    for attempt in range(5):
        files = sink_files(settings.data_dir, sink)
        if not files:
            return []
        try:
            with duckdb.connect() as con:
                rel = con.execute(sql, [files, *params])
                columns = [d[0] for d in rel.description]
                return [dict(zip(columns, row)) for row in rel.fetchall()]
        except duckdb.IOException:
            if attempt == 4:
                raise
    return []


def _redriven(settings: Settings, message_ids: list[str]) -> set[str]:
    """Which of ``message_ids`` were re-driven already: a sink row's ``redrive_of`` points at it,
    or an earlier re-drive event republished it (the job may not have read that message yet)."""
    found = set()
    for sink in ("missing_state", "enriched"):
        found |= {row["redrive_of"] for row in _read_sink(
            settings, sink, "SELECT DISTINCT redrive_of FROM read_parquet(?) WHERE list_contains(?, redrive_of)",
            [message_ids])}
    for event in read_rows(settings.data_dir, "events"):
        if event.get("kind") == "redrive":
            found |= set(event.get("details", {}).get("message_ids") or []) & set(message_ids)
    return found


def _enriched_orders(settings: Settings, invoice_ids: list[int]) -> set[tuple[int, int]]:
    """The (invoice id, line item id) of ``invoice_ids`` that have an enriched row."""
    return {(row["invoice_id"], row["line_item_id"]) for row in _read_sink(
        settings, "enriched", "SELECT DISTINCT invoice_id, line_item_id FROM read_parquet(?) WHERE list_contains(?, invoice_id)",
        [invoice_ids])}


def plan_redrive(settings: Settings, invoice_ids: list[int] | None = None, user_id: int | None = None,
                 item_id: int | None = None, reason: str | None = None, **ids: int | None) -> RedrivePlan:
    """What :func:`redrive` would republish for this selector, and what it would skip; sends nothing.

    The selector is invoice ids, a reason, or an id per lookup by its id column (``user_id``,
    ``item_id``, and any other lookup's through ``ids``).

    Each order line (invoice id, line item id) is decided by its newest matching row: skipped if a
    later row (or an earlier re-drive not read back yet) points at it, or if the order has an
    enriched row; republished otherwise. Its older rows are skipped, so an order goes out at most once.
    """
    keys = _key_ids(user_id, item_id, **ids)
    if not (invoice_ids or any(value is not None for value in keys.values()) or reason):
        raise ControlError("re-drive needs a selector: invoice ids, "
                           + ", ".join(f"{_article(lookup.reason)} {lookup.reason} id" for lookup in LOOKUPS)
                           + " or a reason")
    if reason is not None and reason not in MISSING_REASONS:
        raise ControlError(f"reason {reason!r} is not one of {', '.join(MISSING_REASONS)}")
    rows = find_missing(settings, invoice_ids, reason, **keys)
    plan = RedrivePlan()
    if not rows:
        return plan
    redriven = _redriven(settings, [row["source_message_id"] for row in rows])
    enriched = _enriched_orders(settings, sorted({int(row["invoice_id"]) for row in rows}))
    decided: set[tuple[int, int]] = set()
    for row in reversed(rows):  # newest first: an order's newest row decides, its older rows are skipped
        order = (row["invoice_id"], row["line_item_id"])
        why = (SKIP_REDRIVEN if row["source_message_id"] in redriven else SKIP_DUPLICATE if order in decided
               else SKIP_ENRICHED if order in enriched else None)
        decided.add(order)
        if why:
            plan.skipped[why] = plan.skipped.get(why, 0) + 1
        else:
            plan.rows.append(row)
    plan.rows.reverse()
    return plan


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"


# The sink column of each order wire field: the envelope's column (rules.RECORD_COLUMNS), which a
# missing-state row keeps under its own name where sinks.RENAMED renames it.
_ORDER_SINK_COLUMNS = {field: {envelope: sink for sink, envelope in RENAMED["missing_state"].items()}.get(column, column)
                       for field, column in RECORD_COLUMNS["orders"].items()}


def order_record(row: dict) -> dict:
    """The order's wire record, rebuilt from its missing-state row (times back to epoch ms, -1 none).

    # {"invoiceId": 1001, "lineItemId": 1, "userId": 17, "itemId": 4, "itemName": "…", …, "paidAt": -1}
    """
    record = {}
    for field in wire.ORDER_FIELDS:
        value = row[_ORDER_SINK_COLUMNS[field.name]]
        record[field.name] = (wire.NONE if value is None else int(value.timestamp() * 1000)) if field.time else value
    return record


def redrive(settings: Settings, invoice_ids: list[int] | None = None, user_id: int | None = None,
            item_id: int | None = None, reason: str | None = None, requested_by: str = "console",
            **ids: int | None) -> RedrivePlan:
    """Republish matching missing-state orders to the orders topic, each at most once (see
    :func:`plan_redrive`), with the ``redrive-of`` property naming the row re-driven; returns the
    plan it carried out. Every request is an event, with the message ids it republished."""
    plan = plan_redrive(settings, invoice_ids, user_id, item_id, reason, **ids)
    if plan.rows:
        _publish(settings, plan.rows)
    selector = {k: v for k, v in {"invoice_ids": invoice_ids, **_key_ids(user_id, item_id, **ids),
                                  "reason": reason}.items() if v is not None and v != []}
    MetricsStore(settings.data_dir).event(
        "redrive", f"{plan.describe().replace('will be', 'were')} by {requested_by}", count=plan.count,
        skipped=plan.skipped, requested_by=requested_by, selector=selector,
        message_ids=[row["source_message_id"] for row in plan.rows])
    return plan


def _publish(settings: Settings, rows: list[dict]) -> None:
    from pipeline.feed.broker import resolve_service_url
    from pipeline.feed.topics import make_client

    client = make_client(resolve_service_url(settings), token=settings["pulsar.auth_token"])
    try:
        producer = client.create_producer(settings.topics["orders"], batching_enabled=True, batching_max_publish_delay_ms=5)
        for row in rows:
            record = order_record(row)
            producer.send_async(wire.encode(record), None, partition_key=wire.message_key("orders", record),
                                properties={REDRIVE_PROPERTY: row["source_message_id"]})
        producer.flush()
    except Exception as exc:
        raise ControlError(f"re-drive to {settings.topics['orders']!r} failed: {exc}") from exc
    finally:
        client.close()


def wait_until_stopped(settings: Settings, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while job_is_running(settings):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# ---------------------------------------------------------------------------- state look-up
def inspect_state(settings: Settings, keys: list[tuple[str, int]], client: str = "cli") -> list[dict]:
    """What the job holds for each ``(lookup, key)``: its latest version and the orders waiting.

    Served by this process's one state look-up worker for the data dir (a long-lived
    ``python -m pipeline state --serve`` with its own small Spark session; the console never
    starts Spark itself), through a queue with per-``client`` limits: see
    pipeline/control/state_service.py. Returns one dict per key (pipeline.control.state.KeyState as JSON);
    a limit, a failure or a look-up over the time limit is a ControlError.
    """
    from pipeline.control.state_service import service_for

    return service_for(settings).lookup(keys, client)
