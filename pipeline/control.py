"""Control actions shared by the CLI and the console: savepoints, replay, re-drive, job status.

- A **savepoint** is a named copy of the checkpoint at its last committed batch N: offsets and
  commits up to N and state files up to version N+1. Checkpoint files are written once and
  renamed into place, so a copy filtered by version is consistent even while the job runs.
- **Restore** puts a savepoint back as the checkpoint of a stopped job and removes the sink
  batches after N, which the job will produce again.
- A **replay** request is a file the running job's source picks up (see pipeline/source/offsets.py).
- A **re-drive** republishes missing-state orders with a ``redrive-of`` property.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline import store, wire
from pipeline.config import Settings
from pipeline.errors import ControlError
from pipeline.metrics import MetricsStore, iso, now_ms
from pipeline.sinks import SinkWriter, last_committed_batch

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_VERSIONED = re.compile(r"^(\d+)[._]")


@dataclass(frozen=True)
class SavepointInfo:
    name: str
    batch_id: int
    taken_at: str
    size_bytes: int
    path: Path


def pid_file(settings: Settings) -> Path:
    return settings.data_dir / "job.pid"


def job_is_running(settings: Settings) -> bool:
    """Whether a job process for this data dir is alive (it keeps ``job.pid`` while it runs)."""
    try:
        pid = int(pid_file(settings).read_text().strip())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------- savepoints
def _copy_checkpoint(source: Path, target: Path, batch_id: int) -> None:
    """Copy the checkpoint files that belong to batches <= batch_id."""
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        top = rel.parts[0]
        if path.is_dir():
            continue
        if top in ("offsets", "commits") and rel.name.isdigit() and int(rel.name) > batch_id:
            continue
        if top == "state":
            match = _VERSIONED.match(rel.name)
            if (match and int(match.group(1)) > batch_id + 1) or (rel.name.isdigit() and int(rel.name) > batch_id + 1):
                continue
        if rel.name.startswith(".") and rel.name.endswith(".crc"):
            continue
        destination = target / rel
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


def take_savepoint(settings: Settings, name: str | None = None) -> SavepointInfo:
    """Copy the checkpoint at its last committed batch under ``savepoints/<name>``."""
    name = name or datetime.now(timezone.utc).strftime("sp-%Y%m%d-%H%M%S")
    if not NAME.match(name):
        raise ControlError(f"savepoint name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
    checkpoint = store.checkpoint_dir(settings.data_dir)
    target = store.savepoints_dir(settings.data_dir) / name
    if target.exists():
        raise ControlError(f"savepoint {name!r} already exists; choose another name")
    for attempt in range(3):
        batch_id = last_committed_batch(checkpoint)
        if batch_id < 0:
            raise ControlError(f"no committed batch in {str(checkpoint)!r} yet; run the job first")
        tmp = target.with_name(f".{name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _copy_checkpoint(checkpoint, tmp / "checkpoint", batch_id)
            break
        except FileNotFoundError:  # state maintenance removed an old file mid-copy; copy again
            if attempt == 2:
                raise ControlError(f"the checkpoint kept changing while copying {str(checkpoint)!r}; try again") from None
    size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
    info = {"name": name, "batch_id": batch_id, "taken_at": iso(now_ms()), "size_bytes": size}
    (tmp / "savepoint.json").write_text(json.dumps(info))
    os.rename(tmp, target)
    MetricsStore(settings.data_dir).event("savepoint_taken", f"savepoint {name!r} taken at batch {batch_id}",
                                          name=name, batch_id=batch_id, size_bytes=size)
    return SavepointInfo(path=target, **info)


def list_savepoints(settings: Settings) -> list[SavepointInfo]:
    """Savepoints, newest first."""
    found = []
    root = store.savepoints_dir(settings.data_dir)
    for meta in root.glob("*/savepoint.json") if root.exists() else []:
        try:
            info = json.loads(meta.read_text())
            found.append(SavepointInfo(info["name"], int(info["batch_id"]), info["taken_at"], int(info["size_bytes"]), meta.parent))
        except (OSError, ValueError, KeyError):
            continue
    return sorted(found, key=lambda s: s.taken_at, reverse=True)


def restore_savepoint(settings: Settings, name: str) -> SavepointInfo:
    """Make a savepoint the checkpoint of the (stopped) job; sink batches after it are removed."""
    if job_is_running(settings):
        raise ControlError("the job is running; stop it before restoring a savepoint")
    matches = [s for s in list_savepoints(settings) if s.name == name]
    if not matches:
        known = ", ".join(s.name for s in list_savepoints(settings)) or "none"
        raise ControlError(f"no savepoint named {name!r}; known savepoints: {known}")
    info = matches[0]
    checkpoint = store.checkpoint_dir(settings.data_dir)
    tmp = checkpoint.with_name(".checkpoint.restoring")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(info.path / "checkpoint", tmp)
    if checkpoint.exists():
        shutil.rmtree(checkpoint)
    os.rename(tmp, checkpoint)
    writer = SinkWriter(settings.data_dir)
    writer.discard_uncommitted(-1)
    writer.drop_published_after(info.batch_id)
    MetricsStore(settings.data_dir).event("savepoint_restored", f"savepoint {name!r} restored at batch {info.batch_id}",
                                          name=name, batch_id=info.batch_id, size_bytes=info.size_bytes)
    return info


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
    return int(moment.timestamp() * 1000)


def request_replay(settings: Settings, topic: str, from_time: str | datetime | None = None,
                   requested_by: str = "console") -> dict:
    """Ask the running job to re-read a changelog topic from its start (or from a time)."""
    if topic not in ("users", "items"):
        raise ControlError(f"replay topic {topic!r} is not a changelog; choose 'users' or 'items'")
    folder = store.replay_requests_dir(settings.data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    seqs = [int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()]
    seq = max(seqs, default=0) + 1
    from_ms = None if from_time in (None, "", "earliest") else _parse_time(from_time)
    request = {"seq": seq, "topic": topic, "from": "earliest" if from_ms is None else iso(from_ms),
               "from_ms": from_ms, "requested_at": iso(now_ms()), "requested_by": requested_by}
    tmp = folder / f".{seq:08d}.tmp"
    tmp.write_text(json.dumps(request))
    os.rename(tmp, folder / f"{seq:08d}.json")
    MetricsStore(settings.data_dir).event("replay_requested", f"replay #{seq} of {topic} from {request['from']} "
                                          f"requested by {requested_by}", seq=seq, topic=topic,
                                          requested_by=requested_by, **{"from": request["from"]})
    return request


# ---------------------------------------------------------------------------- re-drive
def find_missing(settings: Settings, invoice_ids=None, user_id=None, item_id=None, reason=None) -> list[dict]:
    """Missing-state rows matching the selector (all of its given parts)."""
    import duckdb

    if not store.sink_dir(settings.data_dir, "missing_state").exists():
        return []
    where, params = [], []
    if invoice_ids:
        where.append(f"invoice_id IN ({', '.join('?' for _ in invoice_ids)})")
        params += [int(i) for i in invoice_ids]
    for column, value in (("user_id", user_id), ("item_id", item_id), ("reason", reason)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    sql = (f"SELECT * FROM read_parquet(?) WHERE {' AND '.join(where) or 'TRUE'} ORDER BY detected_at")
    with duckdb.connect() as con:
        rel = con.execute(sql, [store.sink_glob(settings.data_dir, "missing_state"), *params])
        columns = [d[0] for d in rel.description]
        return [dict(zip(columns, row)) for row in rel.fetchall()]


def _ms(value) -> int:
    return -1 if value is None else int(value.timestamp() * 1000)


def redrive(settings: Settings, invoice_ids: list[int] | None = None, user_id: int | None = None,
            item_id: int | None = None, reason: str | None = None, requested_by: str = "console") -> int:
    """Republish matching missing-state orders to the orders topic; returns how many."""
    if not (invoice_ids or user_id is not None or item_id is not None or reason):
        raise ControlError("re-drive needs a selector: invoice ids, a user id, an item id or a reason")
    if reason is not None and reason not in ("user", "item", "user_and_item"):
        raise ControlError(f"reason {reason!r} is not one of user, item, user_and_item")
    rows = find_missing(settings, invoice_ids, user_id, item_id, reason)
    if not rows:
        return 0
    from pipeline.broker import resolve_service_url
    from pipeline.topics import make_client

    client = make_client(resolve_service_url(settings))
    try:
        producer = client.create_producer(settings.topics["orders"], batching_enabled=True, batching_max_publish_delay_ms=5)
        for row in rows:
            record = {"invoiceId": row["invoice_id"], "lineItemId": row["line_item_id"], "userId": row["user_id"],
                      "itemId": row["item_id"], "itemName": row["item_name"], "itemCategory": row["item_category"],
                      "price": row["price"], "createdAt": _ms(row["created_at"]), "paidAt": _ms(row["paid_at"])}
            producer.send_async(wire.encode(record), None, partition_key=wire.message_key("orders", record),
                                properties={"redrive-of": row["source_message_id"]})
        producer.flush()
    except Exception as exc:
        raise ControlError(f"re-drive to {settings.topics['orders']!r} failed: {exc}") from exc
    finally:
        client.close()
    selector = {k: v for k, v in {"invoice_ids": invoice_ids, "user_id": user_id, "item_id": item_id,
                                  "reason": reason}.items() if v}
    MetricsStore(settings.data_dir).event("redrive", f"{len(rows)} missing-state orders re-driven by {requested_by}",
                                          count=len(rows), requested_by=requested_by, selector=selector)
    return len(rows)


def wait_until_stopped(settings: Settings, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while job_is_running(settings):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
