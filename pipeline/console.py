"""Starting the Streamlit console: ``python -m pipeline app`` runs ``streamlit run app/main.py``.

The console process loads its own settings (``app.resources.get_settings``) from the
environment, so :func:`serve_console` passes every loaded setting down as its ``SS_*``
variable; a TOML file or ``--set`` flag given to the CLI therefore reaches the console too.
Streamlit binds ``app.address``:``app.port`` (127.0.0.1:8501 by default), runs headless,
sends no usage statistics, and gets SIGTERM when the process that started it dies.

Safety (:func:`check_console_access`, checked here before launching and again inside the app,
so ``streamlit run app/main.py`` with a non-loopback ``--server.address`` cannot skip it): off loopback the
console needs an admin token, and shows viewers no tracebacks; a token shorter than
:data:`MIN_TOKEN_CHARS` is refused everywhere.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from pipeline.feed.broker import die_with_parent
from pipeline.config import CONFIG_FILE_ENV, KEYS, Settings
from pipeline.errors import ConfigError, StatefulStreamsError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
APP_MAIN = PROJECT_ROOT / "app" / "main.py"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN_CHARS = 16


def is_loopback(address: str | None) -> bool:
    """Whether a bind address reaches this machine only (None or '' binds every interface)."""
    return bool(address) and (address in LOOPBACK or address.startswith("127."))


def check_console_access(address: str | None, token: str | None) -> None:
    """Refuse a console that anyone on the network could drive: a ConfigError, one line."""
    if token and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"setting 'app.admin_token' has {len(token)} characters; use at least "
                          f"{MIN_TOKEN_CHARS} (e.g. from: python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    if not is_loopback(address) and not token:
        shown = address or "all interfaces"
        raise ConfigError(f"console address {shown!r} is not loopback and 'app.admin_token' is empty; "
                          "set SS_APP_ADMIN_TOKEN to bind a non-loopback address")


def check_port_free(address: str, port: int) -> None:
    """A ConfigError naming the address if something already listens on it."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Streamlit's server binds
        try:
            sock.bind((address, port))
        except OSError as exc:
            raise ConfigError(f"setting 'app.port' = {port} cannot be bound on {address!r} "
                              f"({exc.strerror or exc}); stop what uses it or choose another port") from None


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
    if not is_loopback(settings["app.address"]):
        command += ["--client.showErrorDetails", "none"]  # viewers off this machine see no tracebacks
    return command, env


def serve_console(settings: Settings) -> int:
    """Run the console in the foreground until it exits or is interrupted; returns its exit code."""
    check_console_access(settings["app.address"], settings["app.admin_token"])
    check_port_free(settings["app.address"], settings["app.port"])
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
