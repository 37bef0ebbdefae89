"""What only a browser shows: each notebook's explorer, live in JupyterLab in headless Chromium, answering its sliders.

Every notebook is executed once, by nbmake (`make test`); this test does not run them again. For each notebook it
writes a short notebook of that notebook's own set-up cell and explorer cell, opens it in JupyterLab (started from
this environment on a free loopback port), runs all cells from the Run menu, checks that no cell raised, moves the
explorer's sequence and batch sliders with the keyboard, and checks that the verdict and the figure changed.
Screenshots go to artifacts/browser/. The server is stopped by its process group.
Needs Debian's chromium (`make test` installs it when it can); without it the test skips, unless
OOM_REQUIRE_BROWSER=1 (set by CI), where a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CELL_TIMEOUT_S = 180
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}

pytestmark = pytest.mark.browser


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def explorer_notebook(source: Path, target: Path) -> None:
    """`source`'s first code cell (imports, the case's set-up) and its explorer cell, as a notebook of their own."""
    import nbformat

    nb = nbformat.read(source, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    explorer = [c for c in code if "explore.explorer(" in c.source]
    assert len(explorer) == 1, f"{source.name}: expected one explorer cell, found {len(explorer)}"
    cells = [nbformat.v4.new_code_cell(c.source) for c in (code[0], explorer[0])]
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata), target)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if CHROMIUM is None:
        if os.environ.get("OOM_REQUIRE_BROWSER") == "1":
            pytest.fail("Debian's chromium is not installed: `make test` installs it as root (apt-get install chromium)")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); the browser test needs it")
    pytest.importorskip("playwright")
    port, token = _free_port(), secrets.token_hex(16)
    root = tmp_path_factory.mktemp("lab")               # JupyterLab saves what it runs: never the sources
    (root / "notebooks").mkdir()
    for name in NOTEBOOKS:
        explorer_notebook(ROOT / "notebooks" / name, root / "notebooks" / name)
    (root / "data" / "results").mkdir(parents=True)
    settings = root / "lab-user-settings"                # every cell rendered, no autosave, no news pop-up
    for plugin, values in SETTINGS.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    log = (ARTIFACTS.parent / "jupyterlab.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
           "--ServerApp.open_browser=False", f"--LabApp.user_settings_dir={settings}",
           f"--LabApp.workspaces_dir={root / 'workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"JupyterLab did not start; see {log}")
                time.sleep(0.5)
        yield url, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)           # the server and the kernels it started
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def _dismiss_popups(page) -> None:
    for label in ("No", "Dismiss"):
        button = page.locator(f".jp-toast-button:has-text('{label}')")
        if button.count():
            button.first.click()


def _run_all(page) -> None:
    """Run > Run All Cells, once the kernel is idle and the notebook has focus (the command acts on the current one)."""
    page.locator(".jp-StatusBar-TextItem", has_text="Idle").first.wait_for(timeout=120_000)
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator('[data-command="runmenu:run-all"]').first.click()


def _wait_executed(page, timeout_s: float) -> None:
    """Until every code cell has a number in its prompt and none is running ([*])."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        if prompts and all(p.strip().startswith("[") and p.strip()[1:-2].strip().isdigit() for p in prompts):
            return
        time.sleep(1)
    raise AssertionError(f"cells did not finish in {timeout_s:.0f} s: {prompts}")


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_explorer_renders_in_jupyterlab_and_responds(lab, browser, notebook):
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{url}/lab/tree/notebooks/{notebook}?reset&token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        _dismiss_popups(page)
        _run_all(page)
        _wait_executed(page, CELL_TIMEOUT_S * 2)
        errors = [t for t in page.locator(".jp-OutputArea-output").all_inner_texts()
                  if "Traceback (most recent call last)" in t or "Error Traceback" in t]
        assert not errors, f"{notebook}: a cell raised:\n{errors[0][:2000]}"

        explorer = page.locator(".widget-vbox", has=page.locator(".widget-label", has_text="micro batch")).last
        explorer.scroll_into_view_if_needed()
        verdict = explorer.locator(".widget-html").last
        figure = explorer.locator("canvas:visible").first
        before_text, before_png = verdict.inner_text(), figure.screenshot()
        explorer.screenshot(path=str(ARTIFACTS / f"{notebook[:-6]}-before.png"))
        for label, keys in (("seq", ["End"]), ("micro batch", ["ArrowRight"] * 3)):
            handle = explorer.locator(".widget-slider", has=page.locator(".widget-label", has_text=label)) \
                .locator(".noUi-handle").first
            handle.focus()
            for key in keys:
                handle.press(key)
        page.wait_for_timeout(2500)
        after_text, after_png = verdict.inner_text(), figure.screenshot()
        explorer.screenshot(path=str(ARTIFACTS / f"{notebook[:-6]}-after.png"))
        # sequence and batch cannot move an out-of-memory that happens before the first forward (setup, resume)
        before_forward = any(f"at the {p}" in before_text for p in ("setup", "resume"))
        assert after_text != before_text or before_forward, f"{notebook}: the verdict did not change ({before_text!r})"
        assert after_png != before_png, f"{notebook}: the figure did not change"
    finally:
        page.screenshot(path=str(ARTIFACTS / f"{notebook[:-6]}-page.png"), full_page=False)
        page.close()
