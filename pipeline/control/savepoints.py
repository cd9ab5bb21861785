"""Savepoints: named, consistent copies of the checkpoint, and restoring one into a stopped job.

- A **savepoint** is a named copy of the checkpoint at its last committed batch N: offsets and
  commits up to N and state files up to version N+1. Checkpoint files are written once and
  renamed into place, so a copy filtered by version is consistent even while the job runs.
- **Restore** puts a savepoint back as the checkpoint of a stopped job (it holds the job lock).
  It takes each sink (a Delta table) back to batch N, in one Delta restore commit whose
  transaction version is N, so the batches after N, which the job produces again, commit once.
  Vacuum keeps the sink versions a savepoint records; one whose files are gone all the same is
  refused in one line, before anything changes. A crash at any point leaves either the old or
  the new checkpoint: the copy is swapped in with one rename, and a journal lets the next
  restore or job start finish (or undo) a restore cut short.
- A restore warns when the savepoint is older than the orders topic's retention (where the
  admin API tells it): the orders it would re-read may be gone.
- A restore that went back to batch N rewrote the sinks after N, so a savepoint taken before
  it at a batch past N counts batches the sinks no longer hold: restoring it is refused in
  one line (it would lose and double rows). Each finished restore is a line of
  ``control/restores.jsonl``; each savepoint records how many there were when it was taken.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import re
import shutil
import uuid
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from pipeline import sink_maintenance, store
from pipeline.config import Settings, pulsar_admin_headers
from pipeline.errors import ControlError, SinkError
from pipeline.control.lock import acquire_job_lock, file_lock
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
    # each sink's Delta version when taken, which vacuum keeps (none for a savepoint taken before they were recorded)
    sink_versions: dict[str, int] = field(default_factory=dict, compare=False)


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
    failure (a full disk) nothing is left behind and the error is one line; what a killed take
    left (``.<name>.tmp``) is removed when the next take or the job starts."""
    name = check_name(name or datetime.now(timezone.utc).strftime("sp-%Y%m%d-%H%M%S"))
    checkpoint = store.checkpoint_dir(settings.data_dir)
    target = store.savepoints_dir(settings.data_dir) / name
    tmp = target.with_name(f".{name}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ControlError(f"cannot create {str(target.parent)!r}: {exc.strerror or exc}") from exc
    # One take at a time: under the lock every ``.<name>.tmp`` is a leftover of a killed take.
    with file_lock(target.parent / TAKE_LOCK):
        clean_leftovers(target.parent)
        if target.exists():
            raise ControlError(f"savepoint {name!r} already exists; choose another name")
        size, batch_id, info = _write_savepoint(settings, checkpoint, tmp, target, name)
    MetricsStore(settings.data_dir).event("savepoint_taken", f"savepoint {name!r} taken at batch {batch_id}",
                                          name=name, batch_id=batch_id, size_bytes=size)
    return SavepointInfo(path=target, **info)


TAKE_LOCK = ".take.lock"


def clean_leftovers(root: Path) -> list[str]:
    """Remove the ``.<name>.tmp`` copies that killed takes left under ``root``; call it holding the take lock."""
    removed = []
    for leftover in root.glob(".*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover.name)
    if removed:
        log.warning("removed %d savepoint copies that killed takes left behind: %s", len(removed), ", ".join(removed))
    return removed


def _write_savepoint(settings: Settings, checkpoint: Path, tmp: Path, target: Path, name: str):
    """Copy the checkpoint into ``tmp``, then rename it to ``target``; nothing is left on failure."""
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
        with sink_maintenance.savepoint_versions_lock(settings.data_dir):  # no vacuum between reading and recording
            info["sink_versions"] = sink_maintenance.versions_for_batch(SinkWriter(settings.data_dir).paths,
                                                                        batch_id)  # vacuum keeps them
            (tmp / "savepoint.json").write_text(json.dumps({**info, "restores_before": len(read_restores(settings))}))
            os.rename(tmp, target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ControlError(f"cannot write savepoint {name!r} under {str(target.parent)!r}: "
                           f"{exc.strerror or exc}; nothing was kept, free some space and take it again") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return size, batch_id, info


def list_savepoints(settings: Settings) -> list[SavepointInfo]:
    """Savepoints, newest first."""
    found = []
    root = store.savepoints_dir(settings.data_dir)
    for meta in root.glob("*/savepoint.json") if root.exists() else []:
        if meta.parent.name.startswith("."):
            continue  # a take's copy before its rename (or what a killed take left)
        try:
            info = json.loads(meta.read_text())
            found.append(SavepointInfo(info["name"], int(info["batch_id"]), info["taken_at"], int(info["size_bytes"]),
                                       meta.parent, sink_versions={str(k): int(v) for k, v in
                                                                   (info.get("sink_versions") or {}).items()}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
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
    root = store.savepoints_dir(settings.data_dir)
    if root.exists():
        try:
            with file_lock(root / TAKE_LOCK, timeout_s=0):
                clean_leftovers(root)
        except BlockingIOError:
            pass  # a take is running; the next take cleans up
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
        SinkWriter(settings.data_dir).rollback(plan["batch_id"], plan.get("sink_versions"))  # idempotent: a cut restore redoes it
        _record_restore(settings, plan)
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

    Sink batches up to the savepoint's batch N stay; the sinks go back to N (a Delta restore),
    since the job redoes the batches after it.
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
        abandoned = abandoning_restore(info.batch_id, _restores_before(info), read_restores(settings))
        if abandoned:
            raise ControlError(
                f"savepoint {name!r} (batch {info.batch_id}) was taken before the restore of {abandoned['savepoint']!r} "
                f"went back to batch {abandoned['batch_id']}, and the sinks no longer hold its batches "
                f"{abandoned['batch_id'] + 1}-{info.batch_id}; restoring it would lose and double rows: restore "
                "a savepoint taken since, or start afresh in a new data dir")
        recorded = info.sink_versions
        try:
            SinkWriter(settings.data_dir).rollback_plan(info.batch_id, recorded)  # changes nothing
        except SinkError as exc:
            raise ControlError(f"savepoint {name!r} (batch {info.batch_id}) is older than what the sinks' vacuum kept: "
                               f"{exc}; restore a newer savepoint, or start afresh in a new data dir") from None
        warnings = tuple(filter(None, [retention_warning(settings, info, now_ms() if now is None else now)]))
        checkpoint = store.checkpoint_dir(settings.data_dir)
        copy = checkpoint.with_name(".checkpoint.restoring")
        journal = store.restore_journal_path(settings.data_dir)
        try:
            shutil.rmtree(copy, ignore_errors=True)
            _copy_checkpoint(info.path / "checkpoint", copy)
            store.replace_file(journal, json.dumps({"savepoint": name, "batch_id": info.batch_id,
                                                    "inode": _inode(copy), "restore_id": uuid.uuid4().hex,
                                                    "sink_versions": recorded}))
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
    return replace(info, warnings=warnings)


def abandoning_restore(batch_id: int, restores_before: int, restores: list[dict]) -> dict | None:
    """The first restore after a savepoint (at ``batch_id``, taken when ``restores_before``
    restores had finished) that went back before its batch, or None when its batches stand."""
    return next((r for r in restores[restores_before:] if r["batch_id"] < batch_id), None)


def _restores_path(settings: Settings) -> Path:
    return store.restore_journal_path(settings.data_dir).with_name("restores.jsonl")


def read_restores(settings: Settings) -> list[dict]:
    """Every finished restore, oldest first: ``{"savepoint", "batch_id", "restore_id", "at"}``."""
    try:
        lines = _restores_path(settings).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _record_restore(settings: Settings, plan: dict) -> None:
    # Settling again after a crash must not count one restore twice: the journal's id names it
    # (not the copy's inode, which the file system reuses once a checkpoint is gone).
    restore_id = plan.get("restore_id")
    if restore_id and any(r.get("restore_id") == restore_id for r in read_restores(settings)):
        return
    path = _restores_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"savepoint": plan["savepoint"], "batch_id": plan["batch_id"], "restore_id": restore_id,
                                 "at": iso(now_ms())}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _restores_before(info: SavepointInfo) -> int:
    try:
        return int(json.loads((info.path / "savepoint.json").read_text()).get("restores_before", 0))
    except (OSError, ValueError):
        return 0


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
