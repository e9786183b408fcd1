"""The lab as a researcher meets it: JupyterLab on loopback, each tutorial opened in headless
Chromium (Playwright driving the system's chromium, which `.ci/run` installs from Debian), and its
saved outputs in Notebook 7's page too.

For every tutorial, on a copy in a temporary folder (the tutorials themselves are never written):
1. opened as a fresh clone's notebook is, untrusted: every saved drawing shows as an image that
   loaded (not as raw SVG text nor as `<IPython.core.display.SVG object>`);
2. run from top to bottom in a real kernel: no error outside the cells tagged raises-exception,
   no widget that failed to render, no output that fell back to a Python repr;
3. every tab of every explorer clicked: each shows its section, its drawings loaded;
4. no error in the browser's console, and no uncaught page error.
Screenshots of each tutorial's key outputs land in TESSERA_SCREENSHOTS (docs/screenshots/ is made
this way: `TESSERA_SCREENSHOTS=docs/screenshots make test`), else in a temporary folder.

Without Playwright or a Chromium the tests skip, saying which is missing; CI sets
TESSERA_REQUIRE_BROWSER=1, which makes a missing browser a failure instead.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.relative_to(ROOT) for d in ("tutorials", "notebooks")
                   for p in (ROOT / d).glob("*.ipynb"))
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
RUN_TIMEOUT_S = 900
# Notebook 7.6's shortcuts plugin reads the settings schema of a plugin its page does not load and
# throws this, on its own /tree page as on every notebook: theirs, not the notebook's
NOTEBOOK_7_SHORTCUTS = "Cannot read properties of undefined (reading 'schema')"
# what a drawing looks like when a front end fell back to text: raw SVG markup, or a repr
FALLBACK = re.compile(r"<svg|</svg>|xmlns=|<IPython\.core\.display\.\w+ object>|"
                      r"<tessera\.viz\.\w+\.Image object>|Error displaying widget|"
                      r"Failed to (load|create) (model|view)")


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def _chromium():
    exe = os.environ.get("TESSERA_CHROMIUM") or next(
        (shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if _missing("playwright"):
        return None, "Playwright is not installed (pip install -e '.[test]')"
    if exe is None:
        return None, "no Chromium on PATH (apt-get install chromium, or set TESSERA_CHROMIUM)"
    if _missing("jupyterlab"):
        return None, "JupyterLab is not installed (pip install -e '.[test]')"
    return exe, ""


CHROMIUM, WHY_NOT = _chromium()
if CHROMIUM is None and os.environ.get("TESSERA_REQUIRE_BROWSER") == "1":
    raise RuntimeError(f"TESSERA_REQUIRE_BROWSER=1 but {WHY_NOT}")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=WHY_NOT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(folder: Path):
    """JupyterLab's user settings for a test: every cell kept in the page (so each output can be
    checked), and no news or update checks (nothing outside the machine is reached)."""
    files = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
            {"fetchNews": "false", "checkForUpdates": False},
    }
    for name, value in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def _gpu_here() -> bool:
    from tessera.runtime.gpu import runnable_targets
    return bool(runnable_targets())


def _serve(home: Path):
    """(base URL, token, the folder it serves): JupyterLab serving copies of the notebooks.
    Without a GPU, cells tagged gpu are left out of the copies, as nbval skips them."""
    served = home / "served"
    gpu = _gpu_here()
    for rel in NOTEBOOKS:
        nb = nbformat.read(ROOT / rel, as_version=4)
        if not gpu:
            nb.cells = [c for c in nb.cells if "gpu" not in c.metadata.get("tags", [])]
        (served / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, served / rel)
    _settings(home / "settings")
    port, token = _free_port(), os.urandom(12).hex()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), JUPYTER_PLATFORM_DIRS="1")
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={served}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
           f"--LabApp.user_settings_dir={home / 'settings'}",
           "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "server.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=served)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (home / "server.log").read_text())
                time.sleep(0.3)
        yield base, token, served
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from _serve(tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory):
    """A server of its own for Notebook 7's pages. jupyter_server's static handler caches where it
    found a file by the file's name alone, for every static route of the process, and MathJax's
    fonts have the same names under /static/notebook/ and /static/lab/: once a Notebook 7 page has
    loaded them, the lab's page is refused them (403, "not in root static directory")."""
    yield from _serve(tmp_path_factory.mktemp("notebook7"))


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        # (as root in a container: no sandbox; a small /dev/shm: Chromium uses /tmp instead)
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("TESSERA_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Page:
    """One notebook open in JupyterLab, and what the browser said meanwhile."""

    def __init__(self, browser, base, token, rel, n_cells, app="lab/tree"):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900},
                                     device_scale_factor=1)
        self.console = []
        self.page.on("console", lambda m: m.type == "error" and self.console.append(m.text))
        self.page.on("pageerror", lambda e: self.console.append(f"page error: {e}"))
        self.page.goto(f"{base}/{app}/{rel.as_posix()}?reset&token={token}")
        self.cells = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook "
                                       ".jp-Cell")
        self.page.wait_for_function(
            "([n, lab]) => (window.jupyterapp || !lab) && document.querySelectorAll("
            "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell').length === n",
            arg=[n_cells, app.startswith("lab")], timeout=120_000)

    def outputs(self, i):
        return self.cells.nth(i).locator(".jp-OutputArea-output")

    def wait_images(self):
        """Every <img> in the outputs loaded (or failed): complete, whichever."""
        self.page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-OutputArea-output img')]"
            ".every(i => i.complete)", timeout=60_000)

    def images(self, i):
        """(loaded, broken) images in cell i's outputs."""
        return self.cells.nth(i).evaluate(
            "c => { const im = [...c.querySelectorAll('.jp-OutputArea-output img')];"
            " return [im.filter(i => i.naturalWidth > 0).length,"
            "         im.filter(i => i.naturalWidth === 0).length]; }")

    def command(self, name, timeout_s):
        self.page.set_default_timeout(timeout_s * 1000)
        return self.page.evaluate(f"() => window.jupyterapp.commands.execute('{name}')")

    def close(self):
        self.page.close()


def _saved_drawings(cell) -> int:
    """How many drawings a saved code cell holds: image outputs, and <img>s or <svg>s inside
    HTML (the browser must show each as an image that loaded)."""
    n = 0
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "image/png" in data or "image/svg+xml" in data and "text/html" not in data:
            n += 1
        elif "text/html" in data:
            n += len(re.findall(r"<img\b|<svg\b", "".join(data["text/html"])))
    return n


def _key_cell(nb):
    """The cell a screenshot shows: the first drawing, else the first error the tutorial
    demonstrates, else the first output."""
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.outputs]
    for wanted in (lambda c: _saved_drawings(c) > 0,
                   lambda c: "raises-exception" in c.metadata.get("tags", []),
                   lambda c: True):
        found = [i for i, c in code if wanted(c)]
        if found:
            return found[0]
    return None


def _saved_tabs(nb) -> int:
    """How many explorer tabs the saved notebook's explorers have (a section each); an error's
    explorer is one drawing, not tabs."""
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            page = "".join(out.get("data", {}).get("text/html", ""))
            if "class='tessera-explorer'" in page and "stopped by" not in page:
                n += page.count("<summary><b>")
    return n


def _check_rendered(page: Page, nb, where: str):
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for k in range(page.outputs(i).count()):
            text = page.outputs(i).nth(k).inner_text()
            bad = FALLBACK.search(text)
            assert bad is None, f"{where}: cell {i} shows {bad.group(0)!r} instead of a drawing " \
                                f"or widget: {text[:200]!r}"


def _explorer_tabs(page: Page, nb_name: str, shots: Path) -> int:
    """Click every tab of every explorer widget; each must show a non-empty section whose
    drawings load. Returns the number of tabs clicked."""
    clicked, taken = 0, set()
    tabbars = page.page.locator(".jp-OutputArea-output .widget-tab > .lm-TabBar, "
                                ".jp-OutputArea-output .jupyter-widget-tab > .lm-TabBar")
    for t in range(tabbars.count()):
        bar = tabbars.nth(t)
        tabs = bar.locator(".lm-TabBar-tab")
        widget = bar.locator("xpath=..")
        for j in range(tabs.count()):
            tab = tabs.nth(j)
            tab.scroll_into_view_if_needed()
            tab.click()
            title = tab.inner_text().strip()
            panel = widget.locator(":scope > .widget-tab-contents > :not(.lm-mod-hidden), "
                                   ":scope > .jupyter-widget-tab-contents > "
                                   ":not(.lm-mod-hidden)").first
            panel.wait_for(state="visible", timeout=10_000)
            shown = panel.evaluate("p => p.innerText.trim().length + p.querySelectorAll('img')"
                                   ".length")
            assert shown, f"{nb_name}: explorer tab {title!r} is empty"
            page.wait_images()
            broken = panel.evaluate("p => [...p.querySelectorAll('img')]"
                                    ".filter(i => i.naturalWidth === 0).length")
            assert broken == 0, f"{nb_name}: explorer tab {title!r}: {broken} drawing(s) broken"
            clicked += 1
            shot = shots / f"{nb_name}-explorer-{title.lower()}.png"
            lowered = "give concrete sizes" not in panel.inner_text()
            if title in ("Graph", "Schedule", "Target", "Profile") and lowered and \
                    shot not in taken:
                widget.screenshot(path=shot)
                taken.add(shot)
    return clicked


def _check_saved(page: Page, nb, where: str):
    """The saved outputs, as a fresh clone shows them (untrusted): no drawing fell back to text,
    and each saved drawing is an image that loaded."""
    page.wait_images()
    _check_rendered(page, nb, f"{where} (saved, untrusted)")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not _saved_drawings(cell):
            continue
        loaded, broken = page.images(i)
        assert broken == 0 and loaded >= _saved_drawings(cell), (
            f"{where}: cell {i} saved {_saved_drawings(cell)} drawing(s); the browser shows "
            f"{loaded} loaded, {broken} broken")


@pytest.mark.parametrize("rel", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_saved_outputs_in_notebook_7(notebook7, browser, rel):
    """Notebook 7's page for the same file: its own front end, the same untrusted rendering."""
    if _missing("notebook"):
        pytest.skip("Notebook 7 is not installed (pip install -e '.[test]')")
    base, token, served = notebook7
    nb = nbformat.read(served / rel, as_version=4)
    page = Page(browser, base, token, rel, len(nb.cells), app="notebooks")
    try:
        _check_saved(page, nb, f"{rel} in Notebook 7")
        said = [m for m in page.console if NOTEBOOK_7_SHORTCUTS not in m]
        assert not said, f"{rel}: the browser's console says: {said[:5]}"
    finally:
        page.close()


@pytest.mark.parametrize("rel", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_in_a_browser(lab, browser, shots, rel):
    base, token, served = lab
    nb = nbformat.read(served / rel, as_version=4)
    page = Page(browser, base, token, rel, len(nb.cells))
    try:
        # 1. the saved outputs, untrusted: each drawing an image that loaded
        _check_saved(page, nb, str(rel))
        key = _key_cell(nb)
        if key is not None:
            page.cells.nth(key).scroll_into_view_if_needed()
            page.cells.nth(key).screenshot(path=shots / f"{rel.stem}.png")

        # 2. run every cell in the kernel
        page.command("notebook:clear-all-cell-outputs", 30)
        page.command("notebook:run-all-cells", RUN_TIMEOUT_S)
        page.page.wait_for_function(
            "() => { const p = window.jupyterapp.shell.currentWidget;"
            " const k = p.sessionContext.session && p.sessionContext.session.kernel;"
            " return k && k.status === 'idle' && p.content.widgets.every("
            "   c => c.model.type !== 'code' || c.model.executionCount !== null); }",
            timeout=RUN_TIMEOUT_S * 1000)
        page.wait_images()
        raised = page.page.evaluate(
            "() => window.jupyterapp.shell.currentWidget.content.widgets.map(c =>"
            " c.model.type !== 'code' ? [] : c.model.outputs.toJSON()"
            "   .filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue))")
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if "raises-exception" not in cell.metadata.get("tags", []):
                assert not raised[i], f"{rel}: cell {i} raised {raised[i]}"
            _, broken = page.images(i)
            assert broken == 0, f"{rel}: cell {i}: {broken} drawing(s) did not load"
        _check_rendered(page, nb, f"{rel} (run)")

        # 3. every explorer tab (the live explorers are widgets: as many tabs as saved sections)
        saved_tabs = _saved_tabs(nb)
        clicked = _explorer_tabs(page, rel.stem, shots)
        assert clicked >= saved_tabs, f"{rel}: {clicked} explorer tabs live, {saved_tabs} saved"

        # 4. a quiet console
        assert not page.console, f"{rel}: the browser's console says: {page.console[:5]}"
    finally:
        page.close()
