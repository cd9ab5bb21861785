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
