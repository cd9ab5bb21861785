"""Secrets stay secret (issue 27, item 1): the job started with a Pulsar token and a Spark secret
puts neither on any command line (``ps`` shows every process's to every local user), in its
log, or anywhere under the data dir (the metrics store the console and exporter show, the sinks,
the checkpoint)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.config import load_settings
from pipeline.errors import ConfigError
from pipeline.metrics import read_events, read_rows
from factories import item, keyed, order, publish, user
from jobproc import JobProcess, cli_args
from waiting import wait_for


def command_lines() -> dict[int, bytes]:
    """Every process's command line, as any local user reads it."""
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found[int(proc.name)] = (proc / "cmdline").read_bytes()
            except OSError:  # gone meanwhile
                pass
    return found


def group_of(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]


@pytest.mark.timeout(600)
@pytest.mark.e2e
def test_the_job_puts_its_secrets_on_no_command_line_log_or_store(tmp_path, broker, unique_topics):
    token, spark_secret = f"tok-{secrets.token_hex(16)}", f"sps-{secrets.token_hex(16)}"
    topics = unique_topics()
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path / "data"), "spark.master": "local[2]",
        "job.trigger_interval": "500ms", "enrichment.max_wait": "0s",
        "pulsar.auth_token": token, "spark.auth_secret": spark_secret,
        **{f"topics.{name}": topic for name, topic in topics.items()}})
    assert not any(token in arg or spark_secret in arg for arg in cli_args(settings))
    publish(broker.service_url, topics["users"], keyed("users", [user(u) for u in range(1, 5)]))
    publish(broker.service_url, topics["items"], keyed("items", [item(i) for i in range(1, 3)]))
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, n % 4 + 1, n % 2 + 1) for n in range(20)]))
    needles = [token.encode(), spark_secret.encode()]
    log = tmp_path / "job.log"
    job = JobProcess(settings, log)
    try:
        wait_for(lambda: read_rows(settings.data_dir, "progress") or job.proc.poll() is not None, timeout=300,
                 what="the job's first batch")
        assert job.proc.poll() is None, log.read_text()[-3000:]
        lines = command_lines()
        tree = {pid: line for pid, line in lines.items() if group_of(pid) == job.proc.pid}
        # the job, its driver JVM and its Python workers: what a secret passed as an argument would reach
        assert any(b"java" in line for line in tree.values()), tree
        assert any(b"pyspark" in line for line in tree.values()) or len(tree) >= 2, tree
        leaks = {pid: line.replace(b"\0", b" ")[:300] for pid, line in lines.items() if any(n in line for n in needles)}
        assert not leaks, f"a secret is on these command lines: {leaks}"
    finally:
        job.stop()
    text = log.read_bytes()
    assert not [n for n in needles if n in text], "a secret is in the job's log"
    assert not files_holding(settings.data_dir, needles), "a secret is in the data dir"
    # what the console's pages and the exporter read: the job's start event shows the settings masked
    started = read_events(settings.data_dir, ("job_started",))
    assert started and started[0]["details"]["settings"]["pulsar.auth_token"] == "***"
    assert started[0]["details"]["settings"]["spark.auth_secret"] == "***"


@pytest.mark.parametrize("key", ["pulsar.auth_token", "spark.auth_secret", "app.admin_token"])
def test_a_secret_given_with_set_is_refused(key, capsys):
    with pytest.raises(ConfigError, match=f"export SS_{key.upper().replace('.', '_')} instead"):
        cli._settings(cli.build_parser().parse_args(["--set", f"{key}=s3cret-value-long-enough", "run"]))
