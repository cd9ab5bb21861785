"""``python -m pipeline app``: the streamlit command line and the settings it passes down."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import load_settings
from pipeline.console import APP_MAIN, build_console_command

ROOT = Path(__file__).resolve().parent.parent


def test_console_command_binds_the_configured_loopback_address_and_port(tmp_path):
    settings = load_settings(env={}, cli={"paths.data_dir": str(tmp_path), "app.port": "8642"})
    command, _ = build_console_command(settings)
    assert command[1:5] == ["-m", "streamlit", "run", str(APP_MAIN)]
    assert APP_MAIN == ROOT / "app" / "main.py"
    flags = dict(zip(command[5::2], command[6::2]))
    assert flags["--server.address"] == "127.0.0.1"
    assert flags["--server.port"] == "8642"
    assert flags["--server.headless"] == "true"
    assert flags["--browser.gatherUsageStats"] == "false"


def test_the_console_process_loads_the_same_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("SS_CONFIG", str(tmp_path / "ignored.toml"))
    monkeypatch.setenv("SS_SPARK_MASTER", "local[1]")  # the parent's env must not leak past its settings
    settings = load_settings(env={}, cli={
        "paths.data_dir": "relative/data", "job.trigger_interval": "250ms", "enrichment.max_wait": "0",
        "topics.users": "persistent://public/default/people", "app.admin_token": "s3cret",
    })
    _, env = build_console_command(settings)
    assert "SS_CONFIG" not in env
    ss_env = {name: value for name, value in env.items() if name.startswith("SS_")}
    reloaded = load_settings(env=ss_env)
    assert reloaded.values == {**settings.values, "paths.data_dir": str(settings.data_dir)}
    assert reloaded.data_dir.is_absolute() and reloaded["job.trigger_interval"] == 0.25
    assert str(ROOT) in env["PYTHONPATH"].split(":")


def test_python_m_pipeline_app_serves_the_console_and_takes_it_down_with_it(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from pipeline.feed.broker import port_is_open
    from pipeline.feed.ports import find_free_port
    from waiting import wait_for

    port = find_free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("SS_")}
    parent = subprocess.Popen([sys.executable, "-m", "pipeline", "--data-dir", str(tmp_path), "--set", f"app.port={port}", "app"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1) as response:
                return response.read() == b"ok"
        except OSError:
            return False

    try:
        wait_for(lambda: parent.poll() is not None or healthy(), timeout=60, what="the console to answer")
        assert parent.poll() is None and healthy()
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=10)
        wait_for(lambda: not port_is_open("127.0.0.1", port), timeout=20, what="streamlit to stop with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
