"""Restoring a savepoint: no committed batch lost, atomic against kill -9 at any step, a warning
when the savepoint is older than the orders topic keeps messages (issue 13, items 3, 4 and 10).

The checkpoints here are files laid out as Spark lays them out, and the sink batches are
committed to Delta tables by the real :class:`SinkWriter`; no Spark is needed to restore."""

from __future__ import annotations

import http.server
import json
import logging
import os
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline import cli, control, store
from pipeline.control import savepoints
from pipeline.config import load_settings
from pipeline.metrics import read_events
from pipeline.sinks import SCHEMAS, SinkWriter, last_committed_batch
from forkkill import FILE_STEPS, killed_at_step
import sinkread
from waiting import wait_for

TAKEN_AT = "2026-11-22T09:00:00.000Z"
TAKEN_MS = 1795338000000  # TAKEN_AT in epoch ms


def make_settings(data_dir: Path, **extra):
    return load_settings(env={}, cli={"paths.data_dir": str(data_dir), **extra})


def write_checkpoint(folder: Path, batches: int, tag: str) -> None:
    for sub in ("offsets", "commits", "state/0/0"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "metadata").write_text(json.dumps({"id": tag}))
    for batch in range(batches):
        (folder / "offsets" / str(batch)).write_text(f"v1\n{tag}\n{batch}")
        (folder / "commits" / str(batch)).write_text("v1\n{}")
        (folder / "state/0/0" / f"{batch + 1}.changelog").write_text(f"{tag}-{batch}")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def dead_letters(batch_id: int) -> dict[str, pa.Table]:
    row = {"source_topic": ["t"], "source_partition": [0], "source_message_id": [f"m{batch_id}"], "key": ["k"],
           "payload": ["x"], "error": ["bad"], "published_at": [0], "detected_at": [0], "batch_id": [batch_id]}
    return {"dead_letter": pa.table(row).cast(SCHEMAS["dead_letter"])}


def published(data_dir: Path) -> list[int]:
    """The batches the dead-letter table holds now, each row once (the table's current files)."""
    rows = sinkread.rows(data_dir, "dead_letter", "batch_id, source_message_id")
    assert len(rows) == len({row["source_message_id"] for row in rows}), "a batch is in the table twice"
    return sorted(row["batch_id"] for row in rows)


def write_savepoint(data_dir: Path, name: str, batches: int, taken_at: str = TAKEN_AT) -> None:
    folder = store.savepoints_dir(data_dir) / name
    write_checkpoint(folder / "checkpoint", batches, f"savepoint-{name}")
    (folder / "savepoint.json").write_text(json.dumps({"name": name, "batch_id": batches - 1, "taken_at": taken_at,
                                                       "size_bytes": 1}))


@pytest.fixture
def crashed_job(tmp_path):
    """A data dir as ``kill -9`` left it: batches 0-5 committed by Spark, 0-6 in the sinks (the
    crash hit after batch 6's sink commit, before Spark's); and a savepoint at batch 3."""
    data_dir = tmp_path / "data"
    write_checkpoint(store.checkpoint_dir(data_dir), 6, "old")
    writer = SinkWriter(data_dir)
    for batch in range(7):
        writer.commit_batch(dead_letters(batch), batch)
    write_savepoint(data_dir, "at3", 4)
    assert published(data_dir) == [0, 1, 2, 3, 4, 5, 6]
    return data_dir


def test_restore_keeps_the_batches_the_savepoint_counts_as_committed(crashed_job):
    info = control.restore_savepoint(make_settings(crashed_job), "at3")
    assert info.batch_id == 3
    checkpoint = store.checkpoint_dir(crashed_job)
    assert last_committed_batch(checkpoint) == 3 and json.loads((checkpoint / "metadata").read_text()) == {"id": "savepoint-at3"}
    # 0-3 are committed in the savepoint: the job will never redo them, so they must stay.
    # 4, 5 (committed only by the old checkpoint) and 6 (never committed) are redone: taken back.
    assert published(crashed_job) == [0, 1, 2, 3]
    assert SinkWriter(crashed_job).committed_batches()["dead_letter"] == 3
    assert not store.restore_journal_path(crashed_job).exists()
    assert not (crashed_job / ".checkpoint.restoring").exists()


def test_restore_to_an_earlier_batch_drops_published_batches_after_it(crashed_job):
    write_savepoint(crashed_job, "at1", 2)
    control.restore_savepoint(make_settings(crashed_job), "at1")
    assert published(crashed_job) == [0, 1] and last_committed_batch(store.checkpoint_dir(crashed_job)) == 1


def sink_rows(data_dir: Path) -> list[tuple[int, str]]:
    return sorted((row["batch_id"], row["source_message_id"])
                  for row in sinkread.rows(data_dir, "dead_letter", "batch_id, source_message_id"))


def test_restore_to_an_older_then_a_newer_savepoint_row_for_row(crashed_job):
    """Back to batch 1; the job redoes 2-6 with other rows (their transaction version went back
    too, so they commit, once); compaction; then forward to a savepoint at batch 5 of the new
    history: each time the table holds exactly the rows it should, once."""
    settings = make_settings(crashed_job)
    write_savepoint(crashed_job, "at1", 2)
    control.restore_savepoint(settings, "at1")
    assert sink_rows(crashed_job) == [(0, "m0"), (1, "m1")]
    writer = SinkWriter(crashed_job)
    for batch in range(2, 7):
        redo = dead_letters(batch)["dead_letter"]
        redo = redo.set_column(2, "source_message_id", pa.array([f"again{batch}"]))
        assert writer.commit_batch({"dead_letter": redo}, batch)["dead_letter"] == 1
        assert writer.commit_batch({"dead_letter": redo}, batch)["dead_letter"] == 0  # a re-run commits nothing twice
    write_checkpoint(store.checkpoint_dir(crashed_job), 6, "again")
    assert control.take_savepoint(settings, "again5").batch_id == 5
    writer.maintain(compact=True)
    control.restore_savepoint(settings, "again5")
    assert sink_rows(crashed_job) == [(0, "m0"), (1, "m1")] + [(b, f"again{b}") for b in range(2, 6)]
    assert writer.commit_batch({"dead_letter": redo}, 6)["dead_letter"] == 1  # batch 6 again, once


def test_restore_refuses_a_savepoint_older_than_what_vacuum_kept(crashed_job):
    settings = make_settings(crashed_job)
    writer = SinkWriter(crashed_job)
    writer.maintain(compact=True, retention_s=0)  # the per-batch files of batches 0-6 are gone
    with pytest.raises(control.ControlError) as refused:
        control.restore_savepoint(settings, "at3")
    message = str(refused.value)
    assert "'at3' (batch 3) is older than what the sinks' vacuum kept" in message and "\n" not in message
    assert last_committed_batch(store.checkpoint_dir(crashed_job)) == 5  # nothing changed
    assert published(crashed_job) == [0, 1, 2, 3, 4, 5, 6]


def test_vacuum_keeps_a_savepoints_sink_versions_until_the_savepoint_is_deleted(crashed_job):
    """A savepoint records its sinks' versions, and vacuum keeps their files whatever its
    retention: with 0 h, compaction's replaced files go, except those of the savepoint's batch 5,
    which a restore then brings back row for row. Once it is deleted, the next round removes them."""
    from pipeline.sink_maintenance import SinkMaintenance

    settings = make_settings(crashed_job)
    shutil.rmtree(store.savepoints_dir(crashed_job) / "at3")  # taken before savepoints recorded versions
    taken = control.take_savepoint(settings, "kept")
    meta = json.loads((taken.path / "savepoint.json").read_text())
    assert taken.batch_id == 5 and set(meta["sink_versions"]) == {"dead_letter"}
    folder = store.sink_dir(crashed_job, "dead_letter")

    def data_files() -> int:
        return sum(1 for _ in folder.glob("*.parquet"))

    maintenance = SinkMaintenance(SinkWriter(crashed_job), crashed_job, interval_s=0, retention_s=0)
    done = maintenance.run_once()
    assert done["dead_letter"]["files_removed"] == 7 and done["dead_letter"]["files_vacuumed"] == 1  # batch 6's file
    assert data_files() == 7  # the compacted file, and batches 0-5's files that version holds
    control.restore_savepoint(settings, "kept")
    assert published(crashed_job) == [0, 1, 2, 3, 4, 5]
    shutil.rmtree(taken.path)
    maintenance.run_once()
    assert data_files() == 1  # the restore's own file set, compacted; the rest vacuumed
    assert published(crashed_job) == [0, 1, 2, 3, 4, 5]


def test_a_savepoint_taken_while_a_round_compacts_is_kept_by_that_rounds_vacuum(crashed_job, monkeypatch):
    """The race the chaos test met: a round compacts (the batch's files become replaced ones), a
    savepoint is taken right then, and the same round's vacuum (0 h) must still keep its files.
    A round that read the savepoints before compacting vacuumed them, and the restore refused."""
    from pipeline import sink_maintenance
    from pipeline.sink_maintenance import SinkMaintenance

    settings = make_settings(crashed_job)
    shutil.rmtree(store.savepoints_dir(crashed_job) / "at3")  # taken before savepoints recorded versions
    compact = sink_maintenance.compact_table
    taken = []

    def compact_then_take(table, *args, **kwargs):
        facts = compact(table, *args, **kwargs)
        taken.append(control.take_savepoint(settings, "midround"))
        return facts

    monkeypatch.setattr(sink_maintenance, "compact_table", compact_then_take)
    done = SinkMaintenance(SinkWriter(crashed_job), crashed_job, interval_s=0, retention_s=0).run_once()
    assert taken and taken[0].batch_id == 5 and done["dead_letter"]["files_removed"] == 7
    control.restore_savepoint(settings, "midround")
    assert published(crashed_job) == [0, 1, 2, 3, 4, 5]


def test_a_take_waits_for_a_running_vacuum(crashed_job):
    """The other half: while a round vacuums (it holds the lock), a take does not record its versions."""
    from pipeline.sink_maintenance import savepoint_versions_lock

    settings = make_settings(crashed_job)
    finished = threading.Event()
    take = threading.Thread(target=lambda: (control.take_savepoint(settings, "waits"), finished.set()))
    with savepoint_versions_lock(crashed_job):
        take.start()
        # the take copies the checkpoint first, then blocks on the lock: wait for its copy, then check it is held
        wait_for(lambda: (store.savepoints_dir(crashed_job) / ".waits.tmp" / "checkpoint" / "commits" / "5").exists(),
                 timeout=30, what="the take's copy")
        assert not finished.wait(0.5) and not (store.savepoints_dir(crashed_job) / "waits").exists()
    take.join(timeout=30)
    assert finished.is_set() and "waits" in {s.name for s in control.list_savepoints(settings)}


# ------------------------------------------------------------------ kill -9 at every step


STEPS = ("copy2", "rename", "replace", "rmtree", "exchange", "unlink")


def restore_killed_at(data_dir: Path, name: str, step: int, exchange: bool) -> bool:
    """Restore in a forked child that SIGKILLs itself just before its ``step``-th file system
    step; True if it was killed, False if the restore finished first."""
    steps = FILE_STEPS + ((savepoints, "_exchange", savepoints._exchange if exchange else (lambda a, b: False)),
                          (Path, "unlink"))
    return killed_at_step(lambda: control.restore_savepoint(make_settings(data_dir), name), step, steps)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_kill_9_at_any_step_of_a_restore_leaves_the_old_or_the_new_checkpoint(tmp_path, exchange):
    template = tmp_path / "template"
    write_checkpoint(store.checkpoint_dir(template), 6, "old")
    writer = SinkWriter(template)
    for batch in range(7):
        writer.commit_batch(dead_letters(batch), batch)
    write_savepoint(template, "at3", 4)
    old = snapshot(store.checkpoint_dir(template))
    new = snapshot(store.savepoints_dir(template) / "at3" / "checkpoint")
    outcomes = {"old": 0, "new": 0}
    for step in range(1, 200):
        data_dir = tmp_path / f"run{step}"
        shutil.copytree(template, data_dir)
        killed = restore_killed_at(data_dir, "at3", step, exchange)
        checkpoint = store.checkpoint_dir(data_dir)
        if exchange or not killed:  # with an atomic exchange, even before any recovery
            assert snapshot(checkpoint) in (old, new), f"killed at step {step}: neither checkpoint"
        # The next job start (or restore) settles what the crash left, holding the job lock.
        with control.acquire_job_lock(make_settings(data_dir), "test"):
            control.recover_restore(make_settings(data_dir))
        state = snapshot(checkpoint)
        assert state in (old, new), f"killed at step {step}: neither checkpoint after recovery"
        if state == new:
            outcomes["new"] += 1
            assert published(data_dir) == [0, 1, 2, 3], f"step {step}"
        else:
            outcomes["old"] += 1
            # the old checkpoint: every batch it committed is still in the sinks
            assert published(data_dir) == [0, 1, 2, 3, 4, 5, 6], f"step {step}"
        assert not store.restore_journal_path(data_dir).exists()
        assert sorted(p.name for p in data_dir.iterdir() if p.name.startswith(".checkpoint")) == []
        if not killed:
            break
    assert not killed, "the restore never finished"
    assert outcomes["old"] > 0 and outcomes["new"] > 0, outcomes


# ------------------------------------------------------------------------ the job lock


def test_restore_refuses_while_the_job_lock_is_held(crashed_job):
    settings = make_settings(crashed_job)
    with control.acquire_job_lock(settings, "job"):
        assert control.job_is_running(settings)
        with pytest.raises(control.ControlError, match="a job already runs on data dir"):
            control.restore_savepoint(settings, "at3")
    assert not control.job_is_running(settings)
    assert published(crashed_job) == [0, 1, 2, 3, 4, 5, 6]  # nothing was touched


# ---------------------------------------------------------------------------- retention


class AdminAPI(http.server.BaseHTTPRequestHandler):
    """Pulsar's admin REST API as far as retention goes: the applied policy of a topic."""

    policies: dict[str, dict] = {}

    def do_GET(self):
        policy = self.policies.get(self.path)
        body = json.dumps(policy).encode() if policy is not None else b""
        self.send_response(200 if policy is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def admin_api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AdminAPI)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", AdminAPI.policies
    server.shutdown()
    server.server_close()
    AdminAPI.policies.clear()


ORDERS_RETENTION = "/admin/v2/persistent/public/default/orders/retention?applied=true"


def test_restore_warns_when_the_savepoint_is_older_than_the_orders_retention(crashed_job, admin_api):
    url, policies = admin_api
    policies[ORDERS_RETENTION] = {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
    settings = make_settings(crashed_job, **{"pulsar.admin_url": url})
    info = control.restore_savepoint(settings, "at3", now=TAKEN_MS + (3 * 60 + 5) * 60_000)
    assert info.warnings == ("savepoint 'at3' is 3h 5m old but 'persistent://public/default/orders' keeps messages "
                             "for 1h: orders published after the savepoint may be gone and will not be enriched; "
                             "give the orders topic a retention longer than your oldest savepoint",)
    events = read_events(crashed_job, ("savepoint_restored",))
    assert events[-1]["details"]["warnings"] == list(info.warnings)


@pytest.mark.parametrize("policy,age_minutes", [
    ({"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}, 10 ** 6),  # infinite
    ({"retentionTimeInMinutes": 240, "retentionSizeInMB": -1}, 200),  # younger than the retention
])
def test_restore_does_not_warn_within_the_retention(crashed_job, admin_api, policy, age_minutes):
    url, policies = admin_api
    policies[ORDERS_RETENTION] = policy
    settings = make_settings(crashed_job, **{"pulsar.admin_url": url})
    assert control.restore_savepoint(settings, "at3", now=TAKEN_MS + age_minutes * 60_000).warnings == ()


def test_restore_falls_back_to_the_namespace_retention(crashed_job, admin_api):
    url, policies = admin_api
    policies["/admin/v2/namespaces/public/default/retention"] = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    settings = make_settings(crashed_job, **{"pulsar.admin_url": url})
    warning, = control.restore_savepoint(settings, "at3", now=TAKEN_MS + 60_000).warnings
    assert "keeps messages for no time at all once read (retention 0)" in warning


def test_restore_without_an_admin_api_skips_the_check_with_a_log_line(crashed_job, caplog):
    with caplog.at_level(logging.INFO, logger="pipeline.control.savepoints"):
        info = control.restore_savepoint(make_settings(crashed_job), "at3", now=TAKEN_MS + 10 ** 12)
    assert info.warnings == ()
    assert "no pulsar.admin_url: not comparing the age of savepoint 'at3' with the retention of " \
           "'persistent://public/default/orders' (pulsar-lite keeps every message)" in caplog.text


def test_cli_prints_the_retention_warning(crashed_job, admin_api, capsys, monkeypatch):
    url, policies = admin_api
    policies[ORDERS_RETENTION] = {"retentionTimeInMinutes": 1, "retentionSizeInMB": -1}
    for name in [n for n in os.environ if n.startswith("SS_")]:
        monkeypatch.delenv(name)
    assert cli.main(["--data-dir", str(crashed_job), "--set", f"pulsar.admin_url={url}", "savepoint", "restore", "at3"]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("warning: savepoint 'at3' is ") and "keeps messages for 1m" in out.err
    assert "restored savepoint 'at3' (batch 3)" in out.out


def test_a_savepoint_from_a_history_a_restore_abandoned_is_refused(crashed_job):
    """Going back to batch 3 rewrote batches 4 and 5 in the sinks; a savepoint taken before that,
    at batch 5, would count them as committed: refused in one line. One taken after is fine."""
    settings = make_settings(crashed_job)
    write_savepoint(crashed_job, "at5", 6)  # taken before any restore (no restores_before: 0)
    control.restore_savepoint(settings, "at3")
    assert [r["batch_id"] for r in savepoints.read_restores(settings)] == [3]
    with pytest.raises(control.ControlError) as refused:
        control.restore_savepoint(settings, "at5")
    message = str(refused.value)
    assert "'at5' (batch 5)" in message and "'at3' went back to batch 3" in message and "4-5" in message
    assert "\n" not in message
    assert last_committed_batch(store.checkpoint_dir(crashed_job)) == 3  # nothing changed
    taken = control.take_savepoint(settings, "after")  # in the new history: restorable
    assert json.loads((taken.path / "savepoint.json").read_text())["restores_before"] == 1
    control.restore_savepoint(settings, "after")
    control.restore_savepoint(settings, "at3")  # the savepoint the history went back to stays restorable
    assert len(savepoints.read_restores(settings)) == 3


def test_abandoning_restore_is_the_first_that_went_back_past_the_savepoint():
    restores = [{"savepoint": "a", "batch_id": 9}, {"savepoint": "b", "batch_id": 4}, {"savepoint": "c", "batch_id": 2}]
    assert savepoints.abandoning_restore(5, 0, restores)["savepoint"] == "b"
    assert savepoints.abandoning_restore(5, 2, restores)["savepoint"] == "c"
    assert savepoints.abandoning_restore(2, 0, restores) is None
    assert savepoints.abandoning_restore(5, 3, restores) is None


def test_a_savepoint_restores_the_version_it_recorded_not_a_later_compaction_of_it(tmp_path):
    """The chaos test's second red run: a compaction right after the savepoint's batch holds only
    batches up to it too, so the restore took that version, whose files a later round had
    compacted again and vacuumed (0 h), and refused. The version the savepoint recorded, which
    vacuum keeps, is the one restored."""
    from pipeline.sink_maintenance import SinkMaintenance

    data_dir = tmp_path / "data"
    settings, writer = make_settings(data_dir), SinkWriter(data_dir)
    write_checkpoint(store.checkpoint_dir(data_dir), 4, "first")
    for batch in range(4):
        writer.commit_batch(dead_letters(batch), batch)
    assert control.take_savepoint(settings, "at3").batch_id == 3
    maintenance = SinkMaintenance(writer, data_dir, interval_s=0, retention_s=0)
    maintenance.run_once()  # compacts batches 0-3: a version that holds batches up to 3 as well
    for batch in (4, 5):
        writer.commit_batch(dead_letters(batch), batch)
    write_checkpoint(store.checkpoint_dir(data_dir), 6, "later")
    maintenance.run_once()  # compacts again: the first compaction's file is replaced, and vacuumed
    control.restore_savepoint(settings, "at3")
    assert published(data_dir) == [0, 1, 2, 3]
    assert writer.commit_batch(dead_letters(4), 4)["dead_letter"] == 1  # batch 4 again, once
