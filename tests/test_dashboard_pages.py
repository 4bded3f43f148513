"""The dashboard on real clusters: the page served, over RPC and standalone.

A loopback LocalCluster shared by the module after two runs (``trained``),
a preloaded ``dask scheduler``, and schedulers that are silent or lack the
table. Snapshots and components from hand-made runs are in test_dashboard.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

import dask
import numpy as np
import pytest
from _fits import fit, local_cluster, mlp_trainer
from _servers import page_server
from bokeh.client import pull_session
from bokeh.models import Plot
from bokeh.server.server import BokehTornado
from distributed import Client

from daskpri.dashboard.page import install
from daskpri.dashboard.snapshot import snapshot_from_rpc, snapshot_from_run


def status_of(doc) -> dict[str, str]:
    """The RunStatus table of a page's document, field by field."""
    text = doc.get_model_by_name("daskpri-status-table").text
    cells = re.findall(r"<th[^>]*>(.*?)</th><td[^>]*>(.*?)</td>", text)
    return {html.unescape(k): html.unescape(v) for k, v in cells}


def get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


@pytest.fixture(scope="module")
def trained(small_data):
    """A loopback LocalCluster after a uniform run and a projection run (both kept)."""
    with local_cluster(2) as (cluster, client):
        trainers = {strategy: fit(client, small_data, strategy, steps)[0]
                    for strategy, steps in (("uniform", 20), ("projection", 30))}
        url = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        yield cluster, client, url, {k: t.run_id for k, t in trainers.items()}
        for tr in trainers.values():
            tr.close()


def test_page_is_served_on_the_scheduler_dashboard(trained):
    _, _, url, _ = trained
    status, ctype, body = get(f"{url}/daskpri")
    assert status == 200 and ctype.startswith("text/html")
    assert "Bokeh.embed.embed_items" in body and "data-root-id" in body  # a Bokeh document
    assert "Bokeh" in body and "static/js/bokeh" in body  # a Bokeh document, its JS served
    assert 'href="daskpri"' in body  # and it has the dashboard's navigation bar


def test_navigation_bar_of_the_dashboard_links_the_page(trained):
    _, _, url, _ = trained
    for page in ("status", "workers"):
        status, _, body = get(f"{url}/{page}")
        assert status == 200 and '<a href="daskpri">Daskpri</a>' in body


def test_dashboard_listens_on_loopback_only(trained):
    cluster, *_ = trained
    sockets = cluster.scheduler.http_server._sockets.values()
    assert sockets and {s.getsockname()[0] for s in sockets} == {"127.0.0.1"}


def test_page_session_holds_the_newest_run_and_its_baseline(trained):
    _, _, url, runs = trained
    with pull_session(url=f"{url}/daskpri") as session:
        doc = session.document
        fields = status_of(doc)
        assert fields["run"] == runs["projection"] and fields["baseline"] == runs["uniform"]
        assert fields["step"] == "29"  # the last step selected: 0 to 29
        hist = doc.get_model_by_name("daskpri-histogram").data
        assert len(hist["current"]) == 40 and sum(hist["current"]) == pytest.approx(1.0)
        # 'at the start': the run's first priorities, kept by the scheduler, not the
        # ones this page, opened at its end, saw first
        [title] = [p.title.text for p in doc.select({"type": Plot})
                   if p.title.text.startswith("Priority distribution")]
        assert title.endswith("(step 29, start: step 0)"), title
        assert len(doc.get_model_by_name("daskpri-loss").data["loss"]) == 30
        assert len(doc.get_model_by_name("daskpri-baseline-loss").data["loss"]) == 20
        assert len(doc.get_model_by_name("daskpri-accuracy").data["accuracy"]) == 6
        assert len(doc.get_model_by_name("daskpri-heatmap").data["value"]) > 0
        assert list(doc.get_model_by_name("daskpri-throughput").data["slot"]) == [0, 1]


def test_install_is_idempotent(trained):
    _, client, _, _ = trained

    def twice(dask_scheduler):
        from distributed.dashboard.scheduler import template_variables

        assert install(dask_scheduler) and install(dask_scheduler)
        apps = dask_scheduler.http_application.applications
        served = [a for a in apps if isinstance(a, BokehTornado) and "/daskpri" in a.app_paths]
        return len(served), template_variables(dask_scheduler)["pages"].count("daskpri")

    assert client.run_on_scheduler(twice) == (1, 1)


def test_rpc_snapshot_matches_the_in_process_one(trained):
    _, client, _, runs = trained
    name, base = runs["projection"], runs["uniform"]

    def local(dask_scheduler):
        plugin_runs = dask_scheduler.plugins["daskpri"].runs
        return snapshot_from_run(
            plugin_runs[name], name=name, baseline=plugin_runs[base], baseline_name=base
        )

    here = client.run_on_scheduler(local)
    there = client.sync(snapshot_from_rpc, client.scheduler, name, baseline=base)
    assert there.keys() == here.keys()
    for key in ("run", "strategy", "step", "table_step", "n_updates", "elapsed", "cursor"):
        assert there[key] == here[key], key
    for key in ("sum", "seen", "owner"):
        np.testing.assert_array_equal(there["partitions"][key], here["partitions"][key])
    np.testing.assert_array_equal(there["chosen"], here["chosen"])
    np.testing.assert_array_equal(there["histogram"]["current"], here["histogram"]["current"])
    np.testing.assert_array_equal(there["metrics"]["loss"], here["metrics"]["loss"])
    assert there["baseline"]["run"] == base and there["baseline"]["cursor"]["step"] == 19
    assert there["start_histogram"]["step"] == here["start_histogram"]["step"] == 0
    np.testing.assert_array_equal(there["histogram"]["start"], here["histogram"]["start"])
    later = client.sync(snapshot_from_rpc, client.scheduler, name, cursor=there["cursor"])
    assert later["metrics"]["step"].size == 0


def test_the_rpc_snapshot_asks_the_scheduler_for_no_per_sample_priorities(trained):
    """The standalone page's refreshes: the histogram is made on the scheduler, and not
    asked for again while the table is as it was."""
    _, client, _, runs = trained
    name = runs["projection"]

    def hide(op, dask_scheduler):  # the handler ``op`` kept aside on the scheduler, or back
        handlers = dask_scheduler.handlers
        if op in handlers:
            handlers[f"hidden-{op}"] = handlers.pop(op)
        else:
            handlers[op] = handlers.pop(f"hidden-{op}")

    here = client.run_on_scheduler(
        lambda dask_scheduler: snapshot_from_run(dask_scheduler.plugins["daskpri"].runs[name])
    )
    client.run_on_scheduler(hide, "daskpri_priorities")
    try:  # every sample's priority is not needed: the page draws all the same
        there = client.sync(snapshot_from_rpc, client.scheduler, name)
        np.testing.assert_array_equal(there["histogram"]["current"], here["histogram"]["current"])
        assert list(there["histogram"]["label"]) == here["histogram"]["label"]
        np.testing.assert_array_equal(there["chosen"], here["chosen"])
        assert there["table_step"] == here["table_step"]
        client.run_on_scheduler(hide, "daskpri_view")
        try:  # the run has moved no step since: its plots of the priorities are drawn again
            again = client.sync(snapshot_from_rpc, client.scheduler, name, previous=there)
            assert again["histogram"] is there["histogram"]
            assert again["chosen"] is there["chosen"]
            client.run_on_scheduler(hide, "daskpri_priorities")
            # a scheduler of an older daskpri, without daskpri_view: its priorities, then
            old = client.sync(snapshot_from_rpc, client.scheduler, name)
            np.testing.assert_array_equal(old["histogram"]["current"],
                                          here["histogram"]["current"])
        finally:
            client.run_on_scheduler(hide, "daskpri_view")
    finally:
        if "daskpri_priorities" not in client.run_on_scheduler(
                lambda dask_scheduler: list(dask_scheduler.handlers)):
            client.run_on_scheduler(hide, "daskpri_priorities")


def _standalone(scheduler_address: str) -> contextlib.AbstractContextManager[Any]:
    """The standalone app's Bokeh server for ``scheduler_address``, serving in a thread."""
    return page_server(scheduler_address, port=0)


def test_standalone_app_serves_the_page_from_rpc_on_loopback(trained):
    cluster, _, _, runs = trained
    with _standalone(cluster.scheduler_address) as server:
        assert server.address == "127.0.0.1"
        assert {s.getsockname()[0] for s in server._http._sockets.values()} == {"127.0.0.1"}
        status, _, _ = get(f"http://127.0.0.1:{server.port}/daskpri")  # opens a session
        assert status == 200
        [session] = server.get_sessions("/daskpri")
        doc = session.document  # read on the server: its refreshes ask the scheduler by RPC
        # Over RPC, runs come oldest first: the app follows the newest.
        first, n_steps = runs["projection"], 30
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            shown = status_of(doc)["run"]
            loss = list(doc.get_model_by_name("daskpri-loss").data["loss"])
            if shown == first and len(loss) == n_steps:
                break
            time.sleep(0.1)
        assert shown == first and len(loss) == n_steps
        assert sorted(doc.get_model_by_name("daskpri-run").options) == sorted(runs.values())
        assert len(doc.get_model_by_name("daskpri-histogram").data["current"]) == 40


def test_the_standalone_page_answers_while_it_waits_on_a_silent_scheduler():
    """Connecting waits out its timeout without holding the document's lock."""
    import socket

    silent = socket.socket()  # accepts connections, never says a word
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        with _standalone(f"tcp://127.0.0.1:{silent.getsockname()[1]}") as server:
            status, _, _ = get(f"http://127.0.0.1:{server.port}/daskpri")  # its first refresh
            assert status == 200                                          # starts connecting
            [session] = server.get_sessions("/daskpri")
            silent.settimeout(30)
            conn, _ = silent.accept()  # the connection is there, its handshake unanswered
            waited: dict = {}

            async def lock_the_document() -> None:
                t0 = time.monotonic()
                await session.with_document_locked(lambda: None)
                waited["s"] = time.monotonic() - t0

            done = threading.Event()
            server.io_loop.add_callback(
                lambda: asyncio.ensure_future(lock_the_document()).add_done_callback(
                    lambda _: done.set()))
            assert done.wait(30)
            # held through the connect, the lock would be free only after its 10 s timeout
            assert waited["s"] < 5, waited
            conn.close()
    finally:
        silent.close()


def test_a_closed_uniform_run_stays_the_baseline_of_the_next_run(small_data):
    """Trainers used as context managers close their runs: the page keeps them."""
    train, test = small_data
    with local_cluster(1) as (cluster, client), _standalone(cluster.scheduler_address) as app:
        page = f"http://127.0.0.1:{cluster.scheduler.http_server.port}/daskpri"
        names = {}
        for strategy, steps in (("uniform", 20), ("loss", 10)):
            with mlp_trainer(client, train, strategy=strategy, batch_size=32,
                             eval_every=5) as tr:
                tr.fit(train, eval_data=test, max_steps=steps, progress=False)
                names[strategy] = tr.run_id
                if strategy == "loss":
                    with pull_session(url=page) as session:
                        fields = status_of(session.document)
                        assert fields["run"] == names["loss"] and fields["state"] == "live"
                        assert fields["baseline"] == names["uniform"]
                        baseline = session.document.get_model_by_name("daskpri-baseline-loss")
                        assert len(baseline.data["loss"]) == 20
                    # a standalone page open while the run ends (read on its server)
                    assert get(f"http://127.0.0.1:{app.port}/daskpri")[0] == 200
                    [standalone] = app.get_sessions("/daskpri")
                    wait_for_status(standalone.document, run=names["loss"], state="live")
        # both closed: the page still shows the last run beside its baseline
        with pull_session(url=page) as session:
            fields = status_of(session.document)
            assert fields["run"] == names["loss"] and fields["state"].startswith("closed")
            assert fields["baseline"] == names["uniform"] and fields["step"] == "9"
        assert list(client.sync(client.scheduler.daskpri_runs)) == [names["uniform"], names["loss"]]
        wait_for_status(standalone.document, run=names["loss"],
                        state="closed (kept for the dashboard)")
        with dask.config.set({"daskpri.table.keep-closed": 0}):  # the scheduler's, in-process
            client.sync(client.scheduler.daskpri_close, run=names["loss"])
        assert list(client.sync(client.scheduler.daskpri_runs)) == []
        # the open page keeps the run's last plots, and says it is gone
        wait_for_status(standalone.document, run=names["loss"],
                        state="closed, dropped from the scheduler (daskpri.table.keep-closed)")


def wait_for_status(doc, timeout: float = 20.0, **expected: str) -> None:
    """Wait until the status table of ``doc`` (a served page's) shows ``expected``."""
    deadline = time.monotonic() + timeout
    while True:
        fields = status_of(doc)
        if all(fields.get(k) == v for k, v in expected.items()):
            return
        assert time.monotonic() < deadline, fields
        time.sleep(0.1)


def test_preloaded_scheduler_serves_the_page(tmp_path):
    scheduler_file = tmp_path / "scheduler.json"
    log = tmp_path / "scheduler.log"
    command = [
        os.path.join(os.path.dirname(sys.executable), "dask"),
        "scheduler",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--dashboard-address",
        "127.0.0.1:0",
        "--preload",
        "daskpri.table.plugin",
        "--scheduler-file",
        str(scheduler_file),
    ]
    with open(log, "wb") as err, subprocess.Popen(command, stdout=err, stderr=err) as proc:
        try:
            deadline = time.monotonic() + 60
            identity = None
            while identity is None:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                try:
                    identity = json.loads(scheduler_file.read_text())
                except (FileNotFoundError, json.JSONDecodeError):  # not (fully) written yet
                    time.sleep(0.1)
            url = f"http://127.0.0.1:{identity['services']['dashboard']}"
            deadline = time.monotonic() + 30
            while True:  # the file is written just before the preload (and plugin) start
                try:
                    status, _, body = get(f"{url}/daskpri")
                    break
                except urllib.error.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            assert status == 200 and "Bokeh.embed.embed_items" in body
            assert '<a href="daskpri">Daskpri</a>' in get(f"{url}/status")[2]
            with pull_session(url=f"{url}/daskpri") as session:
                assert status_of(session.document)["run"] == "no daskpri run yet"
            assert "no /daskpri dashboard page" not in log.read_text()  # no warning logged

            def torch_modules() -> list[str]:  # (by value: the scheduler cannot import this file)
                return sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))

            # the table's plugin and the page, without torch (the workers' and the driver's)
            with Client(scheduler_file=str(scheduler_file), timeout=30) as client:
                assert client.run_on_scheduler(torch_modules) == []
        finally:
            proc.terminate()
            proc.wait(30)


def test_a_scheduler_without_the_table_says_so_rather_than_fail_on_every_refresh(caplog):
    from daskpri.dashboard.snapshot import NoPlugin, run_strategies

    with local_cluster(0, processes=False, host="127.0.0.1", protocol="tcp") as (cluster, client):
        with pytest.raises(NoPlugin, match="the scheduler has no daskpri table yet"):
            client.sync(run_strategies, client.scheduler)
        # the standalone page reached it: it waits for a run, and never says it is away
        with caplog.at_level("INFO", logger="daskpri"), _standalone(
                cluster.scheduler_address) as app:
            assert get(f"http://127.0.0.1:{app.port}/daskpri")[0] == 200
            [session] = app.get_sessions("/daskpri")
            deadline = time.monotonic() + 20
            while "NoPlugin" not in caplog.text:  # its first refresh's answer
                assert time.monotonic() < deadline
                time.sleep(0.05)
            seen = set()
            for _ in range(5):  # the page is drawn just after: it stays so
                seen.add(status_of(session.document)["run"])
                time.sleep(0.1)
            assert seen == {"no daskpri run yet"}


def test_daskpri_train_prints_the_pages_link_before_the_run_serves_it():
    """``daskpri train`` prints where to watch before its trainer adds the page."""
    from daskpri.cli._summary import _dashboard_lines
    from daskpri.table.plugin import RemoteTable

    with local_cluster(0, processes=False, host="127.0.0.1", protocol="tcp") as (cluster, client):
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        assert _dashboard_lines(client) == [f"dashboard: {base}/status",
                                            f"daskpri page: {base}/daskpri (once the run starts)"]
        RemoteTable.ensure_plugin(client)  # as the run starts
        assert get(f"{base}/daskpri")[0] == 200  # the link printed is the page's
        # a later run on the same scheduler: the page is there, said on one line
        assert _dashboard_lines(client) == [f"dashboard: {base}/status (daskpri's page: "
                                            f"{base}/daskpri)"]


def test_a_trainers_dashboard_outside_jupyter_is_the_pages_address(trained, small_data, capsys):
    _, client, url, _ = trained
    train, _ = small_data
    with mlp_trainer(client, train) as trainer:
        address = trainer.dashboard()
    assert address == f"{url}/daskpri"
    assert f"daskpri dashboard: {url}/daskpri" in capsys.readouterr().out
    status, _, body = get(address)
    assert status == 200 and "Bokeh.embed.embed_items" in body
