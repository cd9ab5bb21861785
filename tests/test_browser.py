"""Browser smoke test: the real console in headless Chromium, on a fixture data dir.

Starts ``streamlit run app/main.py`` on a free loopback port, opens every page, checks that
no exception box or traceback shows and that the page's data rendered, saves a screenshot of
each page under tests/_artifacts/, and checks that a control button asks for confirmation
instead of acting.
"""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest

from app_fixtures import write_data_dir
from pipeline import store
from pipeline.feed.ports import find_free_port
from pipeline.config import load_settings
from pipeline.console import build_console_command
from waiting import wait_for

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "_artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# url path -> (page title, a text that appears only once the page's data has rendered)
PAGES = {
    "": ("Live enrichment", "Newest enriched orders"),
    "backpressure": ("Backpressure", "Newest batches"),
    "data_skew": ("Data skew", "Skew of user_lookup"),
    "checkpoints": ("Checkpoints & savepoints", "Checkpoint history"),
    "storage": ("Storage", "On disk, part by part"),
    "missing_state": ("Missing state", "Top missing users"),
    "replay": ("Replay", "Replay #2 of users"),
}

if not CHROMIUM.exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)", allow_module_level=True)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """The console on a fixture data dir, started as ``python -m pipeline app`` starts it:
    ``streamlit run app/main.py`` on 127.0.0.1 and a free port. Yields ``(base url, data dir)``."""
    data_dir = tmp_path_factory.mktemp("browser") / "data"
    write_data_dir(data_dir)
    settings = load_settings(env={}, cli={"paths.data_dir": str(data_dir), "app.port": find_free_port()})
    command, env = build_console_command(settings)
    assert command[3:5] == ["run", str(ROOT / "app" / "main.py")] and env["SS_PATHS_DATA_DIR"] == str(data_dir)
    log = (tmp_path_factory.getbasetemp() / "streamlit.log").open("w")
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    port = settings["app.port"]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: process.poll() is not None or _healthy(url), timeout=60, what="streamlit to serve")
        assert process.poll() is None, f"streamlit exited with {process.returncode}; see {log.name}"
        yield url, data_dir
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    page.goto(url)
    return page


def _charts_and_tables_drawn(page) -> bool:
    """Every plotly chart has drawn its SVG and every table its grid (they load lazily)."""
    return page.evaluate("""() => {
        const charts = document.querySelectorAll('[data-testid="stPlotlyChart"]');
        const drawn = document.querySelectorAll('[data-testid="stPlotlyChart"] .main-svg');
        const tables = document.querySelectorAll('[data-testid="stDataFrame"]');
        const grids = document.querySelectorAll('[data-testid="stDataFrame"] canvas');
        return charts.length > 0 || tables.length > 0
            ? drawn.length >= charts.length && grids.length >= tables.length
            : false;
    }""")


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_without_errors(console, browser, path):
    url, _ = console
    title, rendered_text = PAGES[path]
    page = _open(browser, f"{url}/{path}")
    try:
        page.get_by_role("heading", name=title).first.wait_for(timeout=30_000)
        page.get_by_text(rendered_text).first.wait_for(timeout=30_000)
        wait_for(lambda: _charts_and_tables_drawn(page), timeout=30, what=f"the charts and tables of /{path}")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{path or 'live_enrichment'}.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert "Traceback" not in page.content()
    finally:
        page.close()


def test_a_control_button_asks_for_confirmation_before_acting(console, browser):
    url, data_dir = console
    page = _open(browser, f"{url}/replay")
    try:
        page.get_by_role("button", name="Replay users…").click()
        page.get_by_text("Please confirm:").wait_for(timeout=30_000)
        # Streamlit draws the confirmation's text and its buttons in separate updates
        page.get_by_role("button", name="Confirm").wait_for(state="visible", timeout=30_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "replay_confirmation.png"), full_page=True)
        # Nothing was requested: no replay request file exists until "Confirm" is pressed.
        assert not store.replay_requests_dir(data_dir).exists()
    finally:
        page.close()
