"""What only a browser shows: each notebook, run whole in JupyterLab in headless Chromium on a laptop's screen
(1366 x 768, the file browser open), its figures inside their output areas with their legends, its explorer answering
its sliders; and one notebook again with ipympl absent from the kernel (pictures redrawn by the explorer).

Every notebook is also executed by nbmake (`make test`). Here each is copied (JupyterLab saves what it runs: never the
sources) with one cell added at the end that reports, for every open matplotlib figure, whether each legend lies
inside the figure. The test runs all cells from the Run menu, checks that no cell raised, that every canvas (or
picture) fits inside its output area and the visible notebook, that the explorer is no taller than the visible
notebook, moves the explorer's sequence and batch sliders with the keyboard, and checks that the verdict and the
figure changed. Screenshots go to artifacts/browser/. The server is stopped by its process group.
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
CELL_TIMEOUT_S = 300
VIEWPORT = {"width": 1366, "height": 768}           # a common laptop screen
INLINE_NOTEBOOK = "00_where_memory_goes.ipynb"       # run again with ipympl absent
NO_IPYMPL = "python3-no-ipympl"
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


LEGEND_CHECK = """import json as _json
import matplotlib.pyplot as _plt
_report = {"figures": 0, "with_legend": 0, "outside": []}
for _n in _plt.get_fignums():
    _fig = _plt.figure(_n)
    _fig.draw_without_rendering()
    _legends = list(_fig.legends) + [a.get_legend() for a in _fig.axes if a.get_legend() is not None]
    _report["figures"] += 1
    _report["with_legend"] += bool(_legends)
    for _leg in _legends:
        _b = _leg.get_window_extent()
        if _b.x0 < -1 or _b.y0 < -1 or _b.x1 > _fig.bbox.width + 1 or _b.y1 > _fig.bbox.height + 1:
            _report["outside"].append([_n, [round(v) for v in _b.extents], [round(_fig.bbox.width), round(_fig.bbox.height)]])
print("LEGENDS " + _json.dumps(_report))
"""


def browser_notebook(source: Path, target: Path, kernel: str | None = None) -> None:
    """`source`'s code cells (markdown left out: nothing to check there), then the legend check, as a notebook."""
    import nbformat

    nb = nbformat.read(source, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert sum("explore.explorer(" in c.source for c in code) == 1, f"{source.name}: expected one explorer cell"
    cells = [nbformat.v4.new_code_cell(c.source) for c in code] + [nbformat.v4.new_code_cell(LEGEND_CHECK)]
    metadata = dict(nb.metadata)
    if kernel:
        metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=metadata), target)


def no_ipympl_kernel(share: Path) -> Path:
    """A kernel of this environment in which `import ipympl` fails (a meta-path finder refuses it), as on a Jupyter
    without ipympl."""
    blocker = share / "no-ipympl-path"
    blocker.mkdir(parents=True)
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoIpympl:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ipympl' or name.startswith('ipympl.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'ipympl' (hidden by the browser test)\", name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoIpympl())\n")
    spec = share / "kernels" / NO_IPYMPL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 without ipympl", "language": "python", "env": {"PYTHONPATH": str(blocker)}}))
    return share


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
        browser_notebook(ROOT / "notebooks" / name, root / "notebooks" / name)
    browser_notebook(ROOT / "notebooks" / INLINE_NOTEBOOK, root / "notebooks" / f"inline-{INLINE_NOTEBOOK}", NO_IPYMPL)
    os.symlink(ROOT / "data", root / "data")            # the notebooks read ../data; results they write go there too
    share = no_ipympl_kernel(root / "share" / "jupyter")
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
    env = {**os.environ, "JUPYTER_PATH": os.pathsep.join(filter(None, [str(share), os.environ.get("JUPYTER_PATH")]))}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, start_new_session=True, env=env)
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


def _raised(page) -> list[str]:
    """The outputs that show a cell raised."""
    return [t for t in page.locator(".jp-OutputArea-output").all_inner_texts()
            if "Traceback (most recent call last)" in t or "Error Traceback" in t]


def _wait_executed(page, timeout_s: float) -> None:
    """Until every code cell has a number in its prompt and none is running ([*]); or, once a cell has raised and
    none runs, at once (Run All stops at an error: the cells after it would never get a number)."""
    deadline = time.time() + timeout_s
    checked = 0.0
    while time.time() < deadline:
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        if prompts and all(p.strip().startswith("[") and p.strip()[1:-2].strip().isdigit() for p in prompts):
            return
        if prompts and not any("*" in p for p in prompts) and time.time() - checked > 5:
            checked = time.time()
            if _raised(page):
                return
        time.sleep(1)
    raise AssertionError(f"cells did not finish in {timeout_s:.0f} s: {prompts}")


def _open_file_browser(page) -> None:
    """The left sidebar's file browser open, as a reader usually has it."""
    if not page.locator(".jp-FileBrowser").first.is_visible():
        page.locator('.lm-TabBar-tab[data-id="filebrowser"]').first.click()
    page.locator(".jp-FileBrowser").first.wait_for(state="visible", timeout=10_000)


FITS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')
             || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  const visible = panel.getBoundingClientRect();
  const out = [];
  for (const area of document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')) {
    const a = area.getBoundingClientRect();
    const shown = [...area.querySelectorAll('canvas, img')].filter(e => e.getBoundingClientRect().width > 0);
    for (const el of shown) {
      if (el.tagName === 'CANVAS' && el.closest('.jupyter-matplotlib-canvas-container') === null
          && !el.className.includes('jupyter-matplotlib')) continue;
      const r = el.getBoundingClientRect();
      out.push({tag: el.tagName, left: r.left, right: r.right, width: r.width, area_left: a.left, area_right: a.right,
                visible_right: visible.right, visible_height: visible.height});
    }
  }
  return out;
}"""


def _check_fit(page, notebook: str) -> int:
    """Every figure's canvas or picture inside its output area and the visible notebook; returns how many."""
    shown = page.evaluate(FITS)
    assert shown, f"{notebook}: no figure found in the outputs"
    for f in shown:
        assert f["left"] >= f["area_left"] - 1 and f["right"] <= f["area_right"] + 1, \
            f"{notebook}: a {f['tag']} of {f['width']:.0f} px does not fit its output area: {f}"
        assert f["right"] <= f["visible_right"] + 1, f"{notebook}: a {f['tag']} is cut at the notebook's right edge: {f}"
    return len(shown)


def _legends(page, notebook: str) -> dict:
    text = [t for t in page.locator(".jp-OutputArea-output").all_inner_texts() if t.startswith("LEGENDS ")]
    assert text, f"{notebook}: the legend check printed nothing"
    return json.loads(text[-1].split(" ", 1)[1])


def _settled_screenshot(page, figures, timeout_s: float = 60.0) -> bytes:
    """The figure once its redraws have stopped: two screenshots a second apart that agree. Without ipympl each redraw
    replaces the picture, so on a loaded machine the element taken may be detached before its screenshot: taken again
    (up to `timeout_s`)."""
    from playwright.sync_api import Error as PlaywrightError

    last, end = None, time.monotonic() + timeout_s
    while True:
        try:
            png = figures.first.screenshot()
        except PlaywrightError as err:                  # replaced by a redraw between finding it and taking it
            if "not attached" not in str(err) or time.monotonic() > end:
                raise
            png = None
        if png is not None and png == last:
            return png
        assert time.monotonic() < end, f"the figure kept changing for {timeout_s:.0f} s after the sliders moved"
        last = png
        page.wait_for_timeout(1000)


def _explore(page, notebook: str, tag: str, figure_selector: str) -> None:
    """Move the explorer's seq and batch sliders; the verdict and the figure must change."""
    explorer = page.locator(".widget-vbox", has=page.locator(".widget-label", has_text="micro batch")).last
    explorer.scroll_into_view_if_needed()
    height = explorer.bounding_box()["height"]
    visible = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first.bounding_box()["height"]
    assert height <= visible, f"{notebook}: the explorer is {height:.0f} px tall, the visible notebook {visible:.0f} px"
    verdict = explorer.locator(".widget-html").last
    figure = explorer.locator(figure_selector).first
    before_text, before_png = verdict.inner_text(), figure.screenshot()
    explorer.screenshot(path=str(ARTIFACTS / f"{tag}-before.png"))
    for label, keys in (("seq", ["End"]), ("micro batch", ["ArrowRight"] * 3)):
        handle = explorer.locator(".widget-slider", has=page.locator(".widget-label", has_text=label)) \
            .locator(".noUi-handle").first
        handle.focus()
        for key in keys:
            handle.press(key)
    page.wait_for_timeout(3000)
    after_png = _settled_screenshot(page, explorer.locator(figure_selector))
    after_text = verdict.inner_text()                # read once the redraws have stopped, not before
    explorer.screenshot(path=str(ARTIFACTS / f"{tag}-after.png"))
    # sequence and batch cannot move an out-of-memory that happens before the first forward (setup, resume)
    before_forward = any(f"at the {p}" in before_text for p in ("setup", "resume"))
    assert after_text != before_text or before_forward, f"{notebook}: the verdict did not change ({before_text!r})"
    assert after_png != before_png, f"{notebook}: the figure did not change"


def _run_notebook(browser, url, token, path: str, tag: str):
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(f"{url}/lab/tree/notebooks/{path}?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    _dismiss_popups(page)
    _open_file_browser(page)
    _run_all(page)
    _wait_executed(page, CELL_TIMEOUT_S * 3)
    errors = _raised(page)
    assert not errors, f"{path}: a cell raised:\n{errors[0][:2000]}"
    return page


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_fits_a_laptop_and_its_explorer_responds(lab, browser, notebook):
    url, token = lab
    tag = notebook[:-6]
    page = _run_notebook(browser, url, token, notebook, tag)
    try:
        assert page.locator(".jp-FileBrowser").first.is_visible(), "the file browser should stay open"
        _check_fit(page, notebook)
        legends = _legends(page, notebook)
        assert legends["figures"] >= 1 and legends["with_legend"] >= 1, f"{notebook}: {legends}"
        assert not legends["outside"], f"{notebook}: a legend lies outside its figure: {legends['outside']}"
        _explore(page, notebook, tag, "canvas:visible")
        _check_fit(page, notebook)                     # still inside after the update's new layout
    finally:
        page.screenshot(path=str(ARTIFACTS / f"{tag}-page.png"), full_page=False)
        page.close()


def test_explorer_without_ipympl_redraws_pictures(lab, browser):
    url, token = lab
    notebook = f"inline-{INLINE_NOTEBOOK}"
    page = _run_notebook(browser, url, token, notebook, notebook[:-6])
    try:
        texts = page.locator(".jp-OutputArea-output").all_inner_texts()
        assert not any("jupyter-matplotlib" in t for t in texts)
        assert page.locator(".jp-OutputArea-output canvas").count() == 0, "a live canvas appeared without ipympl"
        assert _check_fit(page, notebook) >= 2                       # the pictures, the explorer's among them
        _explore(page, notebook, notebook[:-6], ".widget-output img")
    finally:
        page.screenshot(path=str(ARTIFACTS / f"{notebook[:-6]}-page.png"), full_page=False)
        page.close()
