"""Control actions shared by the CLI and the console: the job lock, savepoints, replay, re-drive.

- The **job lock** is an ``flock`` on ``<data_dir>/job.lock``, held by the running job and by a
  restore. The OS drops it when its holder dies, however it dies, so a second job on the same
  data dir refuses to start and a restore never runs under a live job.
- A **savepoint** is a named copy of the checkpoint at its last committed batch N: offsets and
  commits up to N and state files up to version N+1. Checkpoint files are written once and
  renamed into place, so a copy filtered by version is consistent even while the job runs.
- **Restore** puts a savepoint back as the checkpoint of a stopped job. It keeps the sink
  batches that the savepoint counts as committed (publishing those still staged) and drops
  only the batches after N, which the job will produce again. A crash at any point leaves
  either the old or the new checkpoint: the copy is swapped in with one rename, and a journal
  lets the next restore or job start finish (or undo) a restore that was cut short.
- A **replay** request is a file the running job's source picks up (see pipeline/source/offsets.py).
- A **re-drive** republishes missing-state orders with a ``redrive-of`` property.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pipeline import store, wire
from pipeline.config import Settings, pulsar_admin_headers
from pipeline.errors import ControlError
from pipeline.metrics import MetricsStore, iso, now_ms
from pipeline.sinks import SinkWriter, last_committed_batch

log = logging.getLogger(__name__)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # used with fullmatch: no trailing newline slips through
_VERSIONED = re.compile(r"^(\d+)[._]")


@dataclass(frozen=True)
class SavepointInfo:
    name: str
    batch_id: int
    taken_at: str
    size_bytes: int
    path: Path
    warnings: tuple[str, ...] = field(default=(), compare=False)


# ---------------------------------------------------------------------------- the job lock
class JobLock:
    """An exclusive ``flock`` on ``<data_dir>/job.lock``; release it, or let the process end."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None

    def __enter__(self) -> "JobLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire_job_lock(settings: Settings, holder: str = "job") -> JobLock:
    """Take the data dir's job lock without waiting; a ControlError if a job or restore holds it."""
    data_dir = store.ensure_data_dir(settings.data_dir)
    path = store.job_lock_path(data_dir)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ControlError(f"cannot open the job lock {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ControlError(f"a job already runs on data dir {str(data_dir)!r} (lock {str(path)!r} held by "
                               f"{owner}); stop it first or use another data dir") from None
        raise ControlError(f"cannot lock {str(path)!r}: {exc.strerror or exc}") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} ({holder})\n".encode(), 0)
    return JobLock(fd, path)


def job_is_running(settings: Settings) -> bool:
    """Whether a job (or a restore) holds this data dir's job lock right now."""
    try:
        fd = os.open(store.job_lock_path(settings.data_dir), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock, if taken


# ---------------------------------------------------------------------------- savepoints
def _copy_checkpoint(source: Path, target: Path, batch_id: int | None = None) -> None:
    """Copy the checkpoint files that belong to batches <= batch_id (all with None); the first
    OSError propagates (a full disk stops the copy at once)."""
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        top = rel.parts[0]
        if path.is_dir():
            continue
        if batch_id is not None:
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


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ControlError(f"savepoint name {name!r} must be 1-64 letters, digits, '.', '_' or '-' "
                           "(starting with a letter or digit)")
    return name


def take_savepoint(settings: Settings, name: str | None = None) -> SavepointInfo:
    """Copy the checkpoint at its last committed batch under ``savepoints/<name>``. On any
    failure (a full disk) nothing is left behind and the error is one line."""
    name = check_name(name or datetime.now(timezone.utc).strftime("sp-%Y%m%d-%H%M%S"))
    checkpoint = store.checkpoint_dir(settings.data_dir)
    target = store.savepoints_dir(settings.data_dir) / name
    if target.exists():
        raise ControlError(f"savepoint {name!r} already exists; choose another name")
    tmp = target.with_name(f".{name}.tmp")
    try:
        for attempt in range(3):
            batch_id = last_committed_batch(checkpoint)
            if batch_id < 0:
                raise ControlError(f"no committed batch in {str(checkpoint)!r} yet; run the job first")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                _copy_checkpoint(checkpoint, tmp / "checkpoint", batch_id)
                break
            except FileNotFoundError:  # state maintenance removed an old file mid-copy; copy again
                if attempt == 2:
                    raise ControlError(f"the checkpoint kept changing while copying {str(checkpoint)!r}; "
                                       "try again") from None
        size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
        info = {"name": name, "batch_id": batch_id, "taken_at": iso(now_ms()), "size_bytes": size}
        (tmp / "savepoint.json").write_text(json.dumps(info))
        os.rename(tmp, target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ControlError(f"cannot write savepoint {name!r} under {str(target.parent)!r}: "
                           f"{exc.strerror or exc}; nothing was kept, free some space and take it again") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a))


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def recover_restore(settings: Settings) -> str | None:
    """Finish or undo a restore that a crash cut short; call it holding the job lock.

    The journal names the copy's inode. If the copy is already the checkpoint, the restore
    is finished (sink batches after the savepoint dropped); if it is still beside the old
    checkpoint, it is removed and the old checkpoint stays. Returns what was done, or None.
    """
    done = _settle_restore(settings)
    if done:
        log.warning("%s: a restore was cut short", done)
    return done


def _settle_restore(settings: Settings) -> str | None:
    journal = store.restore_journal_path(settings.data_dir)
    checkpoint = store.checkpoint_dir(settings.data_dir)
    copy = checkpoint.with_name(".checkpoint.restoring")
    old = checkpoint.with_name(".checkpoint.old")
    try:
        plan = json.loads(journal.read_text())
    except FileNotFoundError:
        shutil.rmtree(copy, ignore_errors=True)  # a copy never journalled: the old checkpoint stands
        return None
    except (OSError, ValueError) as exc:
        raise ControlError(f"the restore journal {str(journal)!r} is unreadable ({exc}); "
                           "restore the savepoint again") from exc
    if _inode(checkpoint) != plan["inode"] and _inode(copy) == plan["inode"] and not checkpoint.exists():
        os.rename(copy, checkpoint)  # cut between the two renames of the fallback swap
    if _inode(checkpoint) == plan["inode"]:
        writer = SinkWriter(settings.data_dir)
        writer.discard_uncommitted(plan["batch_id"])
        writer.drop_published_after(plan["batch_id"])
        shutil.rmtree(copy, ignore_errors=True)  # the old checkpoint, after the swap
        shutil.rmtree(old, ignore_errors=True)
        done = f"finished restoring savepoint {plan['savepoint']!r}"
    else:
        if old.exists() and not checkpoint.exists():
            os.rename(old, checkpoint)
        shutil.rmtree(copy, ignore_errors=True)
        done = f"undid the unfinished restore of savepoint {plan['savepoint']!r}; the old checkpoint stays"
    journal.unlink()
    return done


def restore_savepoint(settings: Settings, name: str, now: int | None = None) -> SavepointInfo:
    """Make a savepoint the checkpoint of the (stopped) job.

    Sink batches up to the savepoint's batch N stay (staged ones committed by the old
    checkpoint are published first); batches after N are dropped, since the job redoes them.
    Holds the job lock throughout, so no job can start mid-restore.
    """
    check_name(name)
    with acquire_job_lock(settings, "restore"):
        recover_restore(settings)
        matches = [s for s in list_savepoints(settings) if s.name == name]
        if not matches:
            known = ", ".join(s.name for s in list_savepoints(settings)) or "none"
            raise ControlError(f"no savepoint named {name!r}; known savepoints: {known}")
        info = matches[0]
        warnings = tuple(filter(None, [retention_warning(settings, info, now_ms() if now is None else now)]))
        checkpoint = store.checkpoint_dir(settings.data_dir)
        copy = checkpoint.with_name(".checkpoint.restoring")
        journal = store.restore_journal_path(settings.data_dir)
        try:
            shutil.rmtree(copy, ignore_errors=True)
            _copy_checkpoint(info.path / "checkpoint", copy)
            writer = SinkWriter(settings.data_dir)
            # Batches both checkpoints count as committed stay; publish those still staged now.
            writer.publish_committed(min(last_committed_batch(checkpoint), info.batch_id))
            journal.parent.mkdir(parents=True, exist_ok=True)
            journal_tmp = journal.with_name(journal.name + ".tmp")
            journal_tmp.write_text(json.dumps({"savepoint": name, "batch_id": info.batch_id, "inode": _inode(copy)}))
            os.replace(journal_tmp, journal)
        except OSError as exc:
            shutil.rmtree(copy, ignore_errors=True)
            raise ControlError(f"cannot restore savepoint {name!r} into {str(checkpoint)!r}: {exc.strerror or exc}"
                               f"{f' ({exc.filename})' if exc.filename else ''}; nothing was changed, "
                               "free some space and try again") from exc
        if not checkpoint.exists():
            os.rename(copy, checkpoint)
        elif not _exchange(copy, checkpoint):
            os.rename(checkpoint, copy.with_name(".checkpoint.old"))  # recover_restore finishes a cut here
            os.rename(copy, checkpoint)
            os.rename(copy.with_name(".checkpoint.old"), copy)
        _settle_restore(settings)  # the steps that also finish a restore cut short after the swap
    message = f"savepoint {name!r} restored at batch {info.batch_id}"
    MetricsStore(settings.data_dir).event("savepoint_restored", message + "".join(f"; warning: {w}" for w in warnings),
                                          name=name, batch_id=info.batch_id, size_bytes=info.size_bytes,
                                          warnings=list(warnings))
    return SavepointInfo(info.name, info.batch_id, info.taken_at, info.size_bytes, info.path, warnings)


def _admin_get(settings: Settings, url: str):
    request = urllib.request.Request(url, headers=pulsar_admin_headers(settings))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (204, 404):
            return None
        raise
    return json.loads(body) if body.strip() else None


def load_orders_retention(settings: Settings) -> dict | None:
    """The orders topic's retention policy from the admin API (the applied topic policy, else the
    namespace's): ``{"retentionTimeInMinutes": m, "retentionSizeInMB": s}``; None if unknown."""
    base = settings.admin_url.rstrip("/") + "/admin/v2/"
    scheme, _, rest = settings.topics["orders"].partition("://")
    tenant, namespace, _ = rest.split("/", 2)
    for url in (f"{base}{scheme}/{rest}/retention?applied=true", f"{base}namespaces/{tenant}/{namespace}/retention"):
        policy = _admin_get(settings, url)
        if isinstance(policy, dict) and "retentionTimeInMinutes" in policy:
            return policy
    return None


def describe_age(seconds: float) -> str:
    minutes = int(seconds // 60)
    days, hours, mins = minutes // 1440, minutes % 1440 // 60, minutes % 60
    return " ".join(f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (mins, "m")) if v) or "0m"


def retention_warning(settings: Settings, info: SavepointInfo, now: int) -> str | None:
    """A warning if the savepoint is older than the orders topic keeps messages; None if it is
    not, or if no admin API tells (pulsar-lite: skipped with a log line)."""
    topic = settings.topics["orders"]
    if not settings.admin_url:
        log.info("no pulsar.admin_url: not comparing the age of savepoint %r with the retention of %r "
                 "(pulsar-lite keeps every message)", info.name, topic)
        return None
    try:
        policy = load_orders_retention(settings)
    except (OSError, ValueError) as exc:
        log.warning("cannot read the retention of %r from %r (%s); restoring without checking it",
                    topic, settings.admin_url, exc)
        return None
    if policy is None:
        log.info("the admin API at %r gives no retention for %r; not checking it", settings.admin_url, topic)
        return None
    minutes = int(policy.get("retentionTimeInMinutes") or 0)
    taken_ms = int(datetime.fromisoformat(info.taken_at.replace("Z", "+00:00")).timestamp() * 1000)
    age_s = max(0.0, (now - taken_ms) / 1000)
    if minutes < 0 or age_s <= minutes * 60:
        return None
    keeps = f"{describe_age(minutes * 60)}" if minutes else "no time at all once read (retention 0)"
    return (f"savepoint {info.name!r} is {describe_age(age_s)} old but {topic!r} keeps messages for {keeps}: "
            "orders published after the savepoint may be gone and will not be enriched; "
            "give the orders topic a retention longer than your oldest savepoint")


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
    if topic not in ("users", "items"):
        raise ControlError(f"replay topic {topic!r} is not a changelog; choose 'users' or 'items'")
    from_ms = None if from_time in (None, "", "earliest") else _parse_time(from_time)
    store.ensure_data_dir(settings.data_dir)
    folder = store.replay_requests_dir(settings.data_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        seqs = [int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()]
        seq = max(seqs, default=0) + 1
        request = {"seq": seq, "topic": topic, "from": "earliest" if from_ms is None else iso(from_ms),
                   "from_ms": from_ms, "requested_at": iso(now_ms()), "requested_by": requested_by}
        tmp = folder / f".{seq:08d}.tmp"
        tmp.write_text(json.dumps(request))
        os.rename(tmp, folder / f"{seq:08d}.json")
    except OSError as exc:
        raise ControlError(f"cannot write the replay request under {str(folder)!r}: {exc.strerror or exc}") from exc
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

    client = make_client(resolve_service_url(settings), token=settings["pulsar.auth_token"])
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


# ---------------------------------------------------------------------------- state look-up
def inspect_state(settings: Settings, keys: list[tuple[str, int]], timeout_s: float = 300.0) -> list[dict]:
    """What the job holds for each ``(lookup, key)``: its latest version and the orders waiting.

    Runs ``python -m pipeline state … --json`` as a process of its own (its own small Spark
    session reads the checkpoint), so the console never starts Spark. Returns one dict per key
    (pipeline.state.KeyState as JSON).
    """
    import subprocess
    import sys

    from pipeline.console import PROJECT_ROOT, settings_environment

    env = {name: value for name, value in os.environ.items() if not name.startswith("SS_")}
    env.update(settings_environment(settings))
    command = [sys.executable, "-m", "pipeline", "state", *(str(part) for pair in keys for part in pair), "--json"]
    try:
        done = subprocess.run(command, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ControlError(f"reading the job's state took over {timeout_s:.0f}s; try again") from None
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        raise ControlError((errors[-1][len("error: "):] if errors else f"the state look-up failed (exit {done.returncode})"))
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
