"""Where everything lives under ``<data_dir>``: the one map of the on-disk layout.

```
<data_dir>/broker/                     embedded broker data, log, endpoint.json
<data_dir>/checkpoint/                 Spark checkpoint of the running query (RocksDB state)
<data_dir>/source-stats/               what each topic partition's entries held when last read (batch planning)
<data_dir>/sinks/<name>/               one Delta Lake table per sink (_delta_log/ and Parquet files; pipeline/sinks.py)
<data_dir>/metrics/<stream>/<day>.jsonl   append-only progress, tasks and events
<data_dir>/savepoints/<name>/          named copies of the checkpoint (savepoint.json inside)
<data_dir>/savepoints/.versions.lock   flock between a take recording its sinks' versions and the sinks' vacuum
<data_dir>/control/replay/<seq>.json   replay requests the running job picks up
<data_dir>/control/restore.json        journal of a savepoint restore under way (pipeline/control/savepoints.py)
<data_dir>/job.lock                    flock held by the running job (or a restore); the OS drops it when the holder dies
<data_dir>/scratch/<host>-<pid>/       a Spark process's local dirs and JVM temp files (pipeline/runtime/scratch.py)
<data_dir>/sql/<pipeline>/             one SQL pipeline (pipeline/sql/): checkpoint/, sinks/ (Delta), metrics/, pipeline.json,
                                       and a temporal join's event-time/clock-<side>.json (pipeline/sql/join_clock.py)
```

Both the job and the console import this module; it imports nothing heavy.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import ConfigError

SINKS = ("enriched", "missing_state", "dead_letter")
METRIC_STREAMS = ("progress", "tasks", "events", "state", "watermarks")  # watermarks: event time only


def sinks_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "sinks"


def sink_dir(data_dir: Path, sink: str) -> Path:
    if sink not in SINKS:
        raise ValueError(f"unknown sink {sink!r}; expected one of {SINKS}")
    return sinks_dir(data_dir) / sink


def sink_glob(data_dir: Path, sink: str) -> str:
    """The data files of a sink's Delta table, as a glob. Only until the first compaction does
    it match the current rows exactly: compacted files stay on disk until vacuum, so a reader
    that must count each row once reads the log's list (pipeline.sinks.sink_files)."""
    return str(sink_dir(data_dir, sink) / "*.parquet")


def checkpoint_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "checkpoint"


def scratch_dir(data_dir: Path) -> Path:
    """Where each Spark process keeps its local dirs and JVM temporary files (pipeline/runtime/scratch.py)."""
    return Path(data_dir) / "scratch"


def source_stats_dir(data_dir: Path) -> Path:
    """What read tasks record of each partition's entries, for the source's batch caps."""
    return Path(data_dir) / "source-stats"


def metrics_dir(data_dir: Path, stream: str) -> Path:
    if stream not in METRIC_STREAMS:
        raise ValueError(f"unknown metrics stream {stream!r}; expected one of {METRIC_STREAMS}")
    return Path(data_dir) / "metrics" / stream


def metrics_glob(data_dir: Path, stream: str) -> str:
    return str(metrics_dir(data_dir, stream) / "*.jsonl")


def heartbeat_path(data_dir: Path) -> Path:
    """The job's newest sign of life between batches (``{"ts_ms": …}``): written on each of
    Spark's idle events, every 10 s while it has nothing to read (pipeline/listener.py)."""
    return Path(data_dir) / "control" / "heartbeat.json"


def savepoints_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "savepoints"


def savepoint_versions_lock_path(data_dir: Path) -> Path:
    """The lock between a savepoint take and the sinks' vacuum (pipeline/sink_maintenance.py)."""
    return savepoints_dir(data_dir) / ".versions.lock"


def replay_requests_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "control" / "replay"


def restore_journal_path(data_dir: Path) -> Path:
    return Path(data_dir) / "control" / "restore.json"


def sql_pipelines_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "sql"


def sql_dir(data_dir: Path, name: str) -> Path:
    """The folder of the SQL pipeline ``name`` (letters, digits, '_' and '-')."""
    if not name or not all(ch.isalnum() or ch in "_-" for ch in name):
        raise ConfigError(f"SQL pipeline name {name!r} is not allowed; use letters, digits, '_' and '-'")
    return sql_pipelines_dir(data_dir) / name


def job_lock_path(data_dir: Path) -> Path:
    return Path(data_dir) / "job.lock"


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: a temporary file beside it, renamed over it, so a reader
    sees the old file or the new one, never half of one. The temporary name carries the process
    id: two processes replacing one file never write into each other's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def ensure_data_dir(data_dir: Path) -> Path:
    """Create the data dir if needed and check that files can be written in it; a regular
    file, a read-only file system or a missing permission is one ConfigError naming the path."""
    path = Path(data_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"setting 'paths.data_dir' = {str(path)!r} is not a folder; point it at a writable folder")
    probe = path / f".write-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"setting 'paths.data_dir' = {str(path)!r} is not a writable folder "
                          f"({exc.strerror or exc}); point it at a writable folder") from exc
    return path
