"""The command line: every command listed, and bad arguments give one clear line (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_cli(*args: str, data_dir=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")}
    if data_dir is not None:
        env["SS_PATHS_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env, timeout=120)


def test_help_lists_the_commands():
    out = run_cli("--help")
    assert out.returncode == 0
    for command in ("broker", "topics", "datagen", "produce", "run", "savepoint", "replay", "redrive", "app", "demo", "exporter"):
        assert f"    {command}" in out.stdout


@pytest.mark.parametrize("args,expected", [
    (["--set", "job.restart.attempts=x", "topics"], "error: setting 'job.restart.attempts' = 'x' (from command line) is not valid"),
    (["--set", "nonsense", "topics"], "error: --set 'nonsense' is not of the form key=value"),
    (["--set", "job.nope=1", "topics"], "error: unknown setting 'job.nope'"),
    (["--config", "/nonexistent.toml", "topics"], "error: config file '/nonexistent.toml' does not exist"),
    (["savepoint", "restore"], "error: savepoint restore needs a NAME"),
    (["savepoint", "restore", "nosuch"], "error: no savepoint named 'nosuch'"),
    (["savepoint", "take"], "error: no committed batch in"),
    (["savepoint", "take", "bad name!"], "error: savepoint name 'bad name!' must be"),
    (["redrive"], "error: re-drive needs a selector"),
    (["replay", "users", "--from-time", "yesterday"], "error: time 'yesterday' is not an ISO time"),
    (["produce", "orders", "--file", "/nonexistent/orders.csv"], "/nonexistent/orders.csv"),
])
def test_bad_input_gives_one_line(tmp_path, args, expected):
    out = run_cli(*args, data_dir=tmp_path)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert expected in lines[0]


@pytest.mark.parametrize("args,expected", [
    (["replay", "orders"], "invalid choice: 'orders'"),
    (["produce", "carts"], "invalid choice: 'carts'"),
    (["run", "--max-batches", "x"], "'x' is not a whole number >= 0"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["run", "--max-batches", "-5"], "argument --max-batches: '-5' is not a whole number >= 0"),
    (["topics", "--partitions", "-3"], "argument --partitions: '-3' is not a whole number >= 1"),
    (["topics", "--partitions", "0"], "argument --partitions: '0' is not a whole number >= 1"),
    (["produce", "orders", "--rate", "nan"], "argument --rate: 'nan' is not a number >= 0"),
    (["produce", "orders", "--limit", "-1"], "argument --limit: '-1' is not a whole number >= 0"),
])
def test_argparse_rejects_bad_arguments_in_one_line(args, expected):
    out = run_cli(*args)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and expected in lines[0]
