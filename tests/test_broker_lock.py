"""One embedded broker per data dir, never stopped under a process that uses it (issue 27, item 5).

The job, ``sql`` and ``broker`` all reach the broker through ``connect_broker``; these tests run it
in real processes, as those commands do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.feed.broker import EmbeddedBroker, port_is_open, running_embedded_url
from pipeline.errors import BrokerError
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
# A user of the broker, as the job or a SQL pipeline is: connect, say the URL, use it until told to stop.
USER = ("import sys; from pipeline.config import load_settings; from pipeline.job import connect_broker; "
        "sys.argv[2:] and (print('ready', flush=True), sys.stdin.readline()); "
        "url, own = connect_broker(load_settings(env={}, cli={'paths.data_dir': sys.argv[1]})); "
        "print(url, flush=True); sys.stdin.readline(); own is not None and own.stop(); print('done', flush=True)")


def start_user(data_dir: Path, wait_for_go: bool = False) -> subprocess.Popen:
    """A user process; with ``wait_for_go`` it connects only once "go" is written to it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")}
    return subprocess.Popen([sys.executable, "-c", USER, str(data_dir), *(["wait"] if wait_for_go else [])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def finish(user: subprocess.Popen) -> None:
    user.stdin.write("stop\n")
    user.stdin.flush()
    assert user.stdout.readline().strip() == "done", user.stderr.read()
    user.wait(timeout=30)


def pulsar_lites(data_dir: Path) -> list[int]:
    """The pulsar-lite processes running on this data dir's files."""
    db = str(data_dir / "broker" / "db").encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            line = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
        except OSError:
            continue
        if b"pulsar-lite" in line and db in line.split(b"\0"):
            found.append(int(proc.name))
    return found


@pytest.fixture
def users():
    started: list[subprocess.Popen] = []
    yield started
    for user in started:
        if user.poll() is None:
            user.kill()
            user.wait()


def test_a_second_broker_on_the_same_files_is_refused(tmp_path):
    with EmbeddedBroker(tmp_path) as first:
        with pytest.raises(BrokerError, match="an embedded broker already runs on"):
            EmbeddedBroker(tmp_path).start()
        assert running_embedded_url(tmp_path) == first.service_url
    with EmbeddedBroker(tmp_path):  # the lock went with the first
        pass


def test_users_starting_at_once_share_one_broker(tmp_path, users):
    data_dir = tmp_path / "data"
    users += [start_user(data_dir, wait_for_go=True) for _ in range(3)]
    assert [user.stdout.readline().strip() for user in users] == ["ready"] * 3
    for user in users:
        user.stdin.write("go\n")
        user.stdin.flush()
    urls = {user.stdout.readline().strip() for user in users}
    assert len(urls) == 1 and all(url.startswith("pulsar://127.0.0.1:") for url in urls), (urls, users[0].stderr)
    assert len(pulsar_lites(data_dir)) == 1
    for user in users:
        finish(user)


def test_the_starter_leaving_does_not_stop_the_broker_another_uses(tmp_path, users):
    data_dir = tmp_path / "data"
    starter = start_user(data_dir)
    users.append(starter)
    url = starter.stdout.readline().strip()
    other = start_user(data_dir)
    users.append(other)
    assert other.stdout.readline().strip() == url
    host, port = url.removeprefix("pulsar://").split(":")

    finish(starter)  # a SQL pipeline that started the broker ends while the job still uses it
    assert starter.returncode == 0
    assert port_is_open(host, int(port)) and running_embedded_url(data_dir) == url
    assert len(pulsar_lites(data_dir)) == 1

    finish(other)  # the last user gone, the broker stops
    wait_for(lambda: not pulsar_lites(data_dir) and running_embedded_url(data_dir) is None, timeout=30,
             what="the broker to stop after its last user")


def test_a_killed_user_counts_as_gone(tmp_path, users):
    data_dir = tmp_path / "data"
    user = start_user(data_dir)
    users.append(user)
    assert user.stdout.readline().startswith("pulsar://")
    user.kill()
    user.wait()
    wait_for(lambda: not pulsar_lites(data_dir), timeout=30, what="the broker to stop after its user was killed")
