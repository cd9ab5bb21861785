"""Console hardening (issue 13, item 9): the loopback-or-token rule in the app itself, no
tracebacks for viewers off loopback, no short admin tokens, and a brake on guessing them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app import views
from app_fixtures import write_data_dir
from pipeline import store
from pipeline.feed.ports import find_free_port
from pipeline.config import load_settings
from pipeline.console import build_console_command, check_console_access, is_loopback
from pipeline.errors import ConfigError
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "a-long-enough-token-0123"


@pytest.mark.parametrize("address,loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                              ("localhost", True), ("0.0.0.0", False), ("", False), (None, False),
                                              ("10.1.2.3", False), ("::", False)])
def test_what_counts_as_loopback(address, loopback):
    assert is_loopback(address) is loopback


def test_console_access_rules():
    check_console_access("127.0.0.1", None)
    check_console_access("0.0.0.0", TOKEN)
    with pytest.raises(ConfigError, match=re.escape("console address 'all interfaces' is not loopback and 'app.admin_token' is empty")):
        check_console_access(None, None)
    with pytest.raises(ConfigError, match=re.escape("console address '0.0.0.0' is not loopback")):
        check_console_access("0.0.0.0", "")
    with pytest.raises(ConfigError, match=re.escape("setting 'app.admin_token' has 15 characters; use at least 16")):
        check_console_access("127.0.0.1", "x" * 15)


def test_off_loopback_the_console_shows_viewers_no_tracebacks(tmp_path):
    local = load_settings(env={}, cli={"paths.data_dir": str(tmp_path)})
    public = load_settings(env={}, cli={"paths.data_dir": str(tmp_path), "app.address": "0.0.0.0", "app.admin_token": TOKEN})
    assert "--client.showErrorDetails" not in build_console_command(local)[0]
    command = build_console_command(public)[0]
    assert command[command.index("--client.showErrorDetails") + 1] == "none"


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_brake_doubles_the_wait_after_the_free_tries_and_a_right_token_resets_it():
    clock = FakeClock()
    brake = views.WrongTokenBrake(clock, free=3, max_s=8)
    waits = []
    for _ in range(8):
        brake.record(right=False)
        waits.append(brake.wait_seconds())
    assert waits == [0, 0, 0, 1, 2, 4, 8, 8]
    clock.now += 7.5
    assert brake.wait_seconds() == 0.5
    clock.now += 0.5
    brake.record(right=True)
    brake.record(right=False)
    assert brake.wait_seconds() == 0


@pytest.fixture
def replay_page(tmp_path, monkeypatch):
    """``open_(token)``: the replay page on an empty data dir with that admin token, fresh caches."""
    data_dir = tmp_path / "data"

    def open_(token: str) -> AppTest:
        for name in [n for n in os.environ if n.startswith("SS_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("SS_PATHS_DATA_DIR", str(data_dir))
        monkeypatch.setenv("SS_APP_ADMIN_TOKEN", token)
        st.cache_resource.clear()
        st.cache_data.clear()
        return AppTest.from_file(str(ROOT / "pages" / "replay.py"), default_timeout=30).run()

    yield data_dir, open_
    st.cache_resource.clear()
    st.cache_data.clear()


def _try_token(app: AppTest, token: str) -> str:
    if not app.checkbox(key="replay_confirm").value:
        app.checkbox(key="replay_confirm").check().run()
    app.text_input(key="replay_token").input(token).run()
    app.button(key="replay_do").click().run()
    return " ".join(e.value for e in app.error)


def test_repeated_wrong_tokens_are_slowed_down(replay_page, monkeypatch):
    data_dir, open_ = replay_page
    clock = FakeClock()
    brake = views.WrongTokenBrake(clock)
    monkeypatch.setattr(views, "get_token_brake", lambda: brake)
    app = open_(TOKEN)
    app.button(key="replay_ask").click().run()
    for attempt in range(4):
        assert "The admin token is not right" in _try_token(app, f"guess-{attempt}")
    # the fifth try comes too soon: refused without even comparing, the right token too
    assert "Too many wrong admin tokens; try again in 1 s" in _try_token(app, TOKEN)
    assert not store.replay_requests_dir(data_dir).exists()
    clock.now += 1.0
    assert _try_token(app, TOKEN) == ""
    assert len(list(store.replay_requests_dir(data_dir).glob("*.json"))) == 1


def test_a_short_configured_token_turns_the_actions_off(replay_page):
    data_dir, open_ = replay_page
    app = open_("short-token")
    app.button(key="replay_ask").click().run()
    assert "Control actions are off: the configured admin token is shorter than 16 characters" in _try_token(app, "short-token")
    assert not store.replay_requests_dir(data_dir).exists()
    assert "short-token" not in " ".join(e.value for e in app.error)


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
@pytest.mark.parametrize("token,shown", [(None, "The console refuses to serve: console address '0.0.0.0' is not loopback"),
                                         (TOKEN, "Newest enriched orders")])
def test_streamlit_run_on_all_interfaces_needs_a_token_in_the_app_itself(tmp_path, token, shown):
    """``streamlit run app/main.py --server.address 0.0.0.0``, not through ``python -m pipeline app``."""
    from playwright.sync_api import sync_playwright

    data_dir = tmp_path / "data"
    write_data_dir(data_dir)
    port = find_free_port()
    settings = load_settings(env={}, cli={"paths.data_dir": str(data_dir)})
    command, env = build_console_command(settings)
    command[command.index("--server.address") + 1] = "0.0.0.0"
    command[command.index("--server.port") + 1] = str(port)
    if token:
        env["SS_APP_ADMIN_TOKEN"] = token
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox"])
            try:
                page = browser.new_page()
                wait_for(lambda: _answers(page, f"http://127.0.0.1:{port}"), timeout=60, what="streamlit to serve")
                page.get_by_text(shown).first.wait_for(timeout=30_000)
                if not token:
                    assert page.get_by_role("heading", name="Live enrichment").count() == 0
            finally:
                browser.close()
    finally:
        process.terminate()
        process.wait(timeout=20)


def _answers(page, url: str) -> bool:
    try:
        page.goto(url, timeout=5000)
        return True
    except Exception:
        return False


def test_the_brake_is_per_client():
    """Issue 27: one viewer's wrong tokens lock only that viewer out, not everyone."""
    clock = FakeClock()
    brake = views.WrongTokenBrake(clock, free=3, max_s=300)
    for _ in range(12):
        brake.record(right=False, client="10.0.0.5")
    assert brake.wait_seconds("10.0.0.5") == 256
    assert brake.wait_seconds("10.0.0.6") == 0 and brake.wait_seconds("loopback") == 0
    brake.record(right=False, client="10.0.0.6")
    assert brake.wait_seconds("10.0.0.6") == 0  # its first wrong token is free
    brake.record(right=True, client="10.0.0.5")
    assert brake.wait_seconds("10.0.0.5") == 0


def test_the_brake_forgets_clients_whose_lock_ran_out_when_it_is_full():
    clock = FakeClock()
    brake = views.WrongTokenBrake(clock, free=0, max_s=300, max_clients=3)
    for n in range(3):
        brake.record(right=False, client=f"old-{n}")
    clock.now += 10
    brake.record(right=False, client="new")
    assert len(brake._clients) == 1 and brake.wait_seconds("new") == 1


def test_a_viewer_locked_out_does_not_lock_out_another(replay_page, monkeypatch):
    data_dir, open_ = replay_page
    brake = views.WrongTokenBrake(FakeClock())
    monkeypatch.setattr(views, "get_token_brake", lambda: brake)
    who = {"client": "10.0.0.5"}
    monkeypatch.setattr(views, "client_id", lambda: who["client"], raising=False)
    guesser = open_(TOKEN)
    guesser.button(key="replay_ask").click().run()
    for attempt in range(4):
        assert "The admin token is not right" in _try_token(guesser, f"guess-{attempt}")
    assert "Too many wrong admin tokens" in _try_token(guesser, TOKEN)
    who["client"] = "10.0.0.6"  # an operator on another machine, in a session of their own
    operator = AppTest.from_file(str(ROOT / "pages" / "replay.py"), default_timeout=30).run()
    operator.button(key="replay_ask").click().run()
    assert _try_token(operator, TOKEN) == ""
    assert len(list(store.replay_requests_dir(data_dir).glob("*.json"))) == 1
