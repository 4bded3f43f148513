"""The /daskpri page in a real headless Chromium, during a training run.

Needs Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``,
``/usr/bin/chromedriver``) and the ``selenium`` package; skips without them.
Saves a screenshot of the page (to ``docs/dashboard.png`` when
``DASKPRI_UPDATE_SCREENSHOT=1``, else to the test's temporary directory).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from _fits import fit, local_cluster, mlp_trainer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CLOSED = "closed (kept for the dashboard)"
DOCS_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "dashboard.png"

pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason="needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="needs selenium (pip install selenium)"
)

# What the page's Bokeh document holds, read in the browser by model name.
READ = """
const doc = window.Bokeh && Bokeh.documents.length ? Bokeh.documents[0] : null;
if (doc === null) return null;
const data = (name, col) => {
    const m = doc.get_model_by_name(name);
    return m === null ? null : Array.from(m.data.get ? m.data.get(col) : m.data[col]);
};
const views = Object.keys(Bokeh.index).length;
// Bokeh draws in shadow DOMs: look into them.
const deep = (root, selector) => {
    let found = Array.from(root.querySelectorAll(selector));
    for (const el of root.querySelectorAll("*")) {
        if (el.shadowRoot) found = found.concat(deep(el.shadowRoot, selector));
    }
    return found;
};
// the status table's cells that a figure covers (the table drawn over its neighbours)
const covered = (() => {
    const cells = deep(document, "td").map((e) => e.getBoundingClientRect());
    const figures = deep(document, "canvas").map((e) => e.getBoundingClientRect());
    const meet = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1
        && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
    return cells.filter((c) => figures.some((f) => meet(c, f))).length;
})();
return JSON.stringify({
    covered: covered,
    views: views,
    loss: data("daskpri-loss", "loss"),
    histogram: data("daskpri-histogram", "current"),
    heatmap: data("daskpri-heatmap", "value"),
    status: deep(document, "td").map((e) => e.textContent),  // the status table's values
    roots: document.querySelectorAll("div[data-root-id]").length,
    canvases: deep(document, "canvas").length,
});
"""


def read(driver) -> dict | None:
    out = driver.execute_script(READ)
    return None if out is None else json.loads(out)


def wait_until(driver, predicate, timeout: float = 60.0) -> dict:
    """Poll the page's document until ``predicate(state)`` holds."""
    from selenium.common.exceptions import TimeoutException

    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        try:
            state = read(driver)
        except TimeoutException:  # the page busy past the script timeout (a loaded machine)
            continue  # a missed look, not a failed page: look again while time is left
        if state is not None and all(state[k] is not None for k in ("loss", "histogram")):
            if predicate(state):
                return state
        time.sleep(0.25)
    raise AssertionError(f"the page did not reach the expected state; last: {state}")


@pytest.fixture
def chromium():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1200,1500",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_page_shows_a_live_run_in_chromium(small_data, chromium, tmp_path):
    update_docs = os.environ.get("DASKPRI_UPDATE_SCREENSHOT") == "1"
    screenshot = DOCS_SCREENSHOT if update_docs else tmp_path / "dashboard.png"
    train, test = small_data
    with local_cluster(2) as (cluster, client):
        baseline, _ = fit(client, small_data, "uniform", steps=40)
        run = mlp_trainer(client, train, strategy="projection", batch_size=32, eval_every=5)
        errors: list[BaseException] = []

        def live() -> None:
            try:
                # stopped once the page has shown what it should: its budget is only a
                # bound (a loaded machine's page can take 15 s to draw its first state)
                run.fit(train, eval_data=test, max_steps=2000, max_time=120, progress=False)
            except BaseException as e:  # re-raised in the test's thread
                errors.append(e)

        thread = threading.Thread(target=live)
        thread.start()
        try:
            chromium.get(f"http://127.0.0.1:{cluster.scheduler.http_server.port}/daskpri")
            first = wait_until(
                chromium,
                lambda s: (
                    s["status"][0] == run.run_id and len(s["loss"]) >= 5 and len(s["histogram"]) > 0
                ),
            )
            assert first["views"] and first["roots"] and first["canvases"] >= 6  # BokehJS drew
            assert first["covered"] == 0  # the status table, rows wrapped, stays in its place
            assert first["status"][-1] == baseline.run_id  # the uniform run is the baseline
            later = wait_until(
                chromium,
                lambda s: (
                    len(s["loss"]) >= len(first["loss"]) + 10
                    and s["histogram"] != first["histogram"]
                ),
            )
            assert later["loss"][: len(first["loss"])] == first["loss"]  # streamed, not redrawn
            assert later["status"][0] == run.run_id and later["status"][-1] == baseline.run_id
            assert re.fullmatch(r"0\.\d{4} at step [\d,]+", later["status"][7])  # best accuracy
            assert len(later["heatmap"]) > len(first["heatmap"]) or len(later["heatmap"]) >= 150
            time.sleep(1.0)  # let the canvases paint before the picture
            screenshot.parent.mkdir(exist_ok=True)
            assert chromium.save_screenshot(str(screenshot))
        finally:
            run.stop()  # what the page needed is seen: the fit need not use up its budget
            thread.join(60)
            assert not thread.is_alive()
        try:
            if errors:
                raise errors[0]
            # the page draws the run's last step, then the run closes, moving no step:
            # the open page must still say it is closed
            table = cluster.scheduler.plugins["daskpri"].runs[run.run_id]

            def drawn(s: dict) -> bool:  # the step and table updates the scheduler has now
                done = [run.run_id, "live", f"{table.last_step:,}", f"{table.table.n_updates:,}"]
                return [s["status"][i] for i in (0, 1, 4, 12)] == done

            wait_until(chromium, drawn)
            run.close()
            wait_until(chromium, lambda s: s["status"][:2] == [run.run_id, CLOSED], timeout=20)
            console = chromium.get_log("browser")  # read while the page is still served
            assert not [e for e in console if e["level"] == "SEVERE"], console  # no JS error
            # nor BokehJS's warnings ("could not set initial ranges", a figure without data)
            warned = [e for e in console if e["level"] == "WARNING" and "[bokeh" in e["message"]]
            assert not warned, console
        finally:
            baseline.close()
            run.close()
