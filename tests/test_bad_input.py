"""Hostile input to the command line: each is refused in one ``error: …`` line with exit 2,
never a traceback, and leaves nothing half-written behind (issue 13, items 7 and 8)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import cli, control, store
from pipeline.control import savepoints
from pipeline.sinks import last_committed_batch

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, data_dir=None, **settings: str) -> subprocess.CompletedProcess:
    """``python -m pipeline …``; ``settings`` are SS_* variables (secrets go by environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")} | settings
    if data_dir is not None:
        env["SS_PATHS_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)


def one_error_line(out) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder on a read-only file system (a tmpfs mounted ro); skipped where mounting is not allowed."""
    path = tmp_path / "ro"
    if not mount_tmpfs(path, "ro,size=1m"):
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    yield path
    subprocess.run(["umount", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A data dir on a 2 MiB file system. With no permission to mount one, copies in
    pipeline.control fail with ENOSPC after the first file instead, as a full disk does."""
    path = tmp_path / "small"
    if mount_tmpfs(path, "size=2m"):
        yield path
        subprocess.run(["umount", str(path)], check=False)
        return
    copied = []

    def copy_then_fill(src, dst, *args, **kwargs):
        if copied:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        copied.append(dst)
        return shutil.copy2(src, dst, *args, **kwargs)

    monkeypatch.setattr(savepoints.shutil, "copy2", copy_then_fill)
    yield path


def write_checkpoint(folder: Path, batches: int, big_bytes: int = 0) -> None:
    """A checkpoint's files as Spark lays them out: offsets and commits per batch, state versions."""
    for sub in ("offsets", "commits", "state/0/0"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "metadata").write_text('{"id":"test"}')
    for batch in range(batches):
        (folder / "offsets" / str(batch)).write_text(f"v1\n{{}}\n{batch}")
        (folder / "commits" / str(batch)).write_text("v1\n{}")
        (folder / "state/0/0" / f"{batch + 1}.changelog").write_bytes(b"s" * 100)
    if big_bytes:
        (folder / "state/0/0" / "1.zip").write_bytes(os.urandom(big_bytes))


def run_in_process(capsys, monkeypatch, data_dir: Path, *args: str) -> tuple[int, list[str]]:
    """``python -m pipeline …`` in this process (so a test can stand in for a full disk)."""
    for name in [n for n in os.environ if n.startswith("SS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SS_PATHS_DATA_DIR", str(data_dir))
    code = cli.main(list(args))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


# ------------------------------------------------------------------ config files and values


def test_config_that_is_a_folder(tmp_path):
    line = one_error_line(run_cli("--config", str(tmp_path), "topics", data_dir=tmp_path))
    assert f"config file {str(tmp_path)!r} is a folder; pass a TOML file" in line


def test_config_that_is_not_utf8(tmp_path):
    config = tmp_path / "latin1.toml"
    config.write_bytes('[app]\naddress = "caf\xe9"\n'.encode("latin-1"))
    line = one_error_line(run_cli("--config", str(config), "topics", data_dir=tmp_path))
    assert f"config file {str(config)!r} is not UTF-8 text" in line


@pytest.mark.parametrize("toml,expected", [
    ("[enrichment]\nmax_wait = inf\n", "setting 'enrichment.max_wait' = inf"),
    ("[enrichment]\nmax_wait = nan\n", "setting 'enrichment.max_wait' = nan"),
    ("[enrichment]\nmax_wait = 1e308\n", "setting 'enrichment.max_wait' = 1e+308"),
    ("[paths]\ndata_dir = 5\n", "setting 'paths.data_dir' = 5"),
    ("[spark]\nshuffle_partitions = 99999999999999999999\n", "setting 'spark.shuffle_partitions' = 99999999999999999999"),
])
def test_bad_toml_values_fail_in_one_line(tmp_path, toml, expected):
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    line = one_error_line(run_cli("--config", str(config), "topics", data_dir=tmp_path / "data"))
    assert expected in line and "is not valid: expected" in line


# ------------------------------------------------------------------------- the data dir


@pytest.mark.parametrize("command", [["broker"], ["replay", "users"], ["run", "--max-batches", "1"]])
def test_a_data_dir_that_is_a_file(tmp_path, command):
    data_dir = tmp_path / "a-file"
    data_dir.write_text("not a folder")
    line = one_error_line(run_cli(*command, data_dir=data_dir))
    assert f"setting 'paths.data_dir' = {str(data_dir)!r} is not a folder" in line
    assert data_dir.read_text() == "not a folder"


@pytest.mark.parametrize("command", [["broker"], ["replay", "users"], ["run", "--max-batches", "1"]])
def test_a_read_only_data_dir(read_only_dir, command):
    line = one_error_line(run_cli(*command, data_dir=read_only_dir))
    assert f"setting 'paths.data_dir' = {str(read_only_dir)!r} is not a writable folder (Read-only file system)" in line


# ------------------------------------------------------------------------ control commands


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "1969-12-31T23:59:59Z"])
def test_replay_from_a_time_out_of_range(tmp_path, moment):
    line = one_error_line(run_cli("replay", "users", "--from-time", moment, data_dir=tmp_path))
    assert f"time {moment!r} is out of range; give a time from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z" in line
    assert not store.replay_requests_dir(tmp_path).exists()


def test_replay_at_the_edges_of_the_range_is_accepted(tmp_path):
    for moment in ("1970-01-01T00:00:00Z", "9999-12-31T23:59:59Z"):
        out = run_cli("replay", "users", "--from-time", moment, data_dir=tmp_path)
        assert out.returncode == 0, out.stderr
    assert len(list(store.replay_requests_dir(tmp_path).glob("*.json"))) == 2


@pytest.mark.parametrize("name", ["sp1\n", "\nsp1", "sp 1", ".sp", "x" * 65])
def test_savepoint_names_must_match_whole(tmp_path, name):
    write_checkpoint(store.checkpoint_dir(tmp_path), 2)
    line = one_error_line(run_cli("savepoint", "take", name, data_dir=tmp_path))
    assert f"savepoint name {name!r} must be 1-64 letters" in line
    assert not store.savepoints_dir(tmp_path).exists()


def test_savepoint_take_on_a_full_disk_leaves_nothing(small_disk, capsys, monkeypatch):
    write_checkpoint(store.checkpoint_dir(small_disk), 3, big_bytes=1_200_000)
    code, lines = run_in_process(capsys, monkeypatch, small_disk, "savepoint", "take", "sp1")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot write savepoint 'sp1' under {str(store.savepoints_dir(small_disk))!r}: "
                               "No space left on device")
    # no .sp1.tmp left behind (the lock that keeps takes one at a time stays, empty)
    assert [p.name for p in store.savepoints_dir(small_disk).iterdir() if p.name != ".take.lock"] == []


def test_savepoint_restore_on_a_full_disk_changes_nothing(small_disk, capsys, monkeypatch):
    checkpoint = store.checkpoint_dir(small_disk)
    write_checkpoint(checkpoint, 5)
    saved = store.savepoints_dir(small_disk) / "big"
    write_checkpoint(saved / "checkpoint", 3, big_bytes=1_200_000)
    (saved / "savepoint.json").write_text(json.dumps({"name": "big", "batch_id": 2, "taken_at": "2026-11-22T00:00:00.000Z",
                                                      "size_bytes": 1_200_000}))
    before = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*"))
    code, lines = run_in_process(capsys, monkeypatch, small_disk, "savepoint", "restore", "big")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot restore savepoint 'big' into {str(checkpoint)!r}: No space left on device")
    assert lines[0].endswith("nothing was changed, free some space and try again")
    assert not (small_disk / ".checkpoint.restoring").exists()
    assert not store.restore_journal_path(small_disk).exists()
    assert sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*")) == before
    assert last_committed_batch(checkpoint) == 4


# ------------------------------------------------------------------------------ the console


def test_app_refuses_a_port_that_is_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line(run_cli("--set", f"app.port={port}", "app", data_dir=tmp_path))
    assert f"setting 'app.port' = {port} cannot be bound on '127.0.0.1' (Address already in use)" in line


def test_app_refuses_a_short_admin_token(tmp_path):
    out = run_cli("app", data_dir=tmp_path, SS_APP_ADMIN_TOKEN="short-token")
    line = one_error_line(out)
    assert "setting 'app.admin_token' has 11 characters; use at least 16" in line
    assert "short-token" not in out.stderr + out.stdout


def test_a_secret_on_the_command_line_is_refused_without_echoing_it(tmp_path):
    out = run_cli("--set", "app.admin_token=a-long-enough-secret-token", "app", data_dir=tmp_path)
    line = one_error_line(out)
    assert "would put a secret on the command line" in line and "export SS_APP_ADMIN_TOKEN instead" in line
    assert "a-long-enough-secret-token" not in out.stderr + out.stdout
