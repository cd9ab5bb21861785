"""Starting the Streamlit console: ``python -m pipeline app`` runs ``streamlit run app/main.py``.

The console process loads its own settings (``app.resources.get_settings``) from the
environment, so :func:`serve_console` passes every loaded setting down as its ``SS_*``
variable; a TOML file or ``--set`` flag given to the CLI therefore reaches the console too.
Streamlit binds ``app.address``:``app.port`` (127.0.0.1:8501 by default; config refuses a
non-loopback address without an admin token), runs headless, sends no usage statistics, and
gets SIGTERM when the process that started it dies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.broker import die_with_parent
from pipeline.config import CONFIG_FILE_ENV, KEYS, Settings
from pipeline.errors import StatefulStreamsError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
APP_MAIN = PROJECT_ROOT / "app" / "main.py"


def settings_environment(settings: Settings) -> dict[str, str]:
    """Each setting that has a value as its ``SS_*`` variable, in a form the loader reads back."""
    env = {}
    for key in KEYS:
        value = settings[key.name]
        if value is None:
            continue
        if key.name == "paths.data_dir":
            value = settings.data_dir  # absolute, so the console finds it whatever its cwd
        env[key.env] = str(value)
    return env


def build_console_command(settings: Settings) -> tuple[list[str], dict[str, str]]:
    """The ``streamlit run`` command line and the environment to run it with."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SS_")}
    env.update(settings_environment(settings))
    env.pop(CONFIG_FILE_ENV, None)  # every value is already in SS_* above
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "streamlit", "run", str(APP_MAIN),
        "--server.address", str(settings["app.address"]),
        "--server.port", str(settings["app.port"]),
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "minimal",
    ]
    return command, env


def serve_console(settings: Settings) -> int:
    """Run the console in the foreground until it exits or is interrupted; returns its exit code."""
    command, env = build_console_command(settings)
    print(f"console: http://{settings['app.address']}:{settings['app.port']} (data dir {settings.data_dir})", flush=True)
    try:
        # The console dies with this process, however it ends (SIGTERM, kill -9), as the broker does.
        process = subprocess.Popen(command, env=env, cwd=PROJECT_ROOT, preexec_fn=die_with_parent)
    except OSError as exc:
        raise StatefulStreamsError(f"cannot start streamlit ({exc}); install it with: pip install -r requirements.txt") from exc
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait(timeout=10)
        raise
