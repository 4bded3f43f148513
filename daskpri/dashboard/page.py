"""The ``/daskpri`` page on the Dask scheduler's dashboard.

:func:`install` adds the page to a running scheduler's HTTP server (and its
link to the navigation bar of every dashboard page). :class:`TablePlugin`
calls it when it starts, so the page exists whether the plugin came with
``dask scheduler --preload daskpri.table.plugin`` or was registered by the
trainer on a running cluster: in both cases the scheduler's dashboard is
already serving, so the page is a Bokeh application of its own, added to the
scheduler's live ``http_application`` beside distributed's.

The page reads the plugin's runs in the scheduler's process, every
``interval`` ms: the browser never talks to the driver.

Examples
--------
>>> from distributed import LocalCluster
>>> cluster = LocalCluster(dashboard_address="127.0.0.1:0")  # doctest: +SKIP
>>> cluster.scheduler.add_plugin(TablePlugin())  # doctest: +SKIP
>>> # then open http://127.0.0.1:<port>/daskpri
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from bokeh.document import Document
from bokeh.layouts import column, row
from bokeh.models.widgets import Select

from daskpri.dashboard.components import (
    PartitionHeatmap,
    PriorityHistogram,
    RunStatus,
    Speedup,
    TrainingCurves,
    Workers,
)
from daskpri.dashboard.snapshot import add_view_handler, choose_baseline, snapshot_from_run
from daskpri.table.plugin import PLUGIN_NAME, TableRun

logger = logging.getLogger(__name__)

#: The page's path on the dashboard, and its name in the navigation bar.
ROUTE, PAGE = "/daskpri", "daskpri"
#: Milliseconds between two reads of the runs.
INTERVAL = 500


class DaskpriDashboard:
    """The page's layout and what it remembers between two snapshots.

    It shows one run (the newest, until the user picks another in the
    selector) beside its uniform baseline, and keeps the cursors and start
    histogram to pass to the next snapshot. Where the snapshots come from is
    the caller's business: the scheduler's page reads them in-process, the
    standalone app through RPC.

    Examples
    --------
    >>> dash = DaskpriDashboard()
    >>> dash.set_runs({"uniform-1": "uniform", "projection-2": "projection"})
    'projection-2'
    >>> dash.request()["baseline_name"]
    'uniform-1'
    """

    def __init__(self) -> None:
        self.select = Select(title="Run", options=[], value="", width=560, name="daskpri-run")
        self.status = RunStatus()
        self.histogram = PriorityHistogram()
        self.heatmap = PartitionHeatmap()
        self.curves = TrainingCurves()
        self.speedup = Speedup()
        self.workers = Workers()
        self.components = (
            self.status,
            self.histogram,
            self.heatmap,
            self.curves,
            self.speedup,
            self.workers,
        )
        self.root = column(
            row(column(self.select, self.status.root), self.histogram.root),
            row(self.heatmap.root, self.speedup.root),
            self.curves.root,
            self.workers.root,
        )
        self.strategies: dict[str, str] = {}
        self.run: str | None = None
        self.follow_newest = True
        self._setting = False
        self._forget()
        self.select.on_change("value", self._on_select)

    def _forget(self) -> None:
        self.cursor: dict[str, Any] | None = None
        self.start_histogram: dict[str, Any] | None = None
        self.baseline: str | None = None
        self.baseline_cursor: dict[str, Any] | None = None
        self.seen: tuple | None = None
        self.last: dict[str, Any] | None = None  # the last snapshot drawn

    def _on_select(self, attr: str, old: str, new: str) -> None:
        if self._setting or not new or new == self.run:
            return
        self.follow_newest = bool(self.strategies) and new == list(self.strategies)[-1]
        self.run = new
        self._forget()

    def set_runs(self, strategies: Mapping[str, str]) -> str | None:
        """Take the runs now on the scheduler (name: strategy, oldest first).

        Returns the run to show: the newest while following it, else the
        one chosen. A run that is gone stays listed while it is shown.
        """
        self.strategies = dict(strategies)
        names = list(self.strategies)
        if names and (self.follow_newest or self.run is None) and self.run != names[-1]:
            self.run = names[-1]
            self._forget()
        options: list[Any] = names + (
            [self.run] if self.run and self.run not in self.strategies else []
        )
        self._setting = True
        try:
            if list(self.select.options) != options:
                self.select.options = options
            if self.run and self.select.value != self.run:
                self.select.value = self.run
        finally:
            self._setting = False
        return self.run

    def request(self) -> dict[str, Any]:
        """What to ask the next snapshot for: cursors, start histogram, baseline.

        And the ``previous`` snapshot, whose priorities' plots a snapshot
        through RPC draws again while the table has not changed.
        """
        baseline = choose_baseline(self.strategies, self.run)
        if baseline != self.baseline:
            self.baseline, self.baseline_cursor = baseline, None
            self.seen = None
        return {
            "start_histogram": self.start_histogram,
            "cursor": self.cursor,
            "baseline_name": self.baseline,
            "baseline_cursor": self.baseline_cursor,
            "previous": self.last,
        }

    def show(self, snapshot: dict[str, Any]) -> None:
        """Draw ``snapshot`` and remember its cursors and start histogram."""
        if snapshot["run"] != self.run:
            return  # an answer to an older request
        self.cursor = snapshot["cursor"]
        self.start_histogram = snapshot["start_histogram"]
        self.last = snapshot
        base = snapshot.get("baseline")
        if base is not None and base["run"] == self.baseline:
            self.baseline_cursor = base["cursor"]
        for component in self.components:
            component.update(snapshot)


def refresh_from_runs(dash: DaskpriDashboard, runs: Mapping[str, TableRun]) -> bool:
    """Draw the shown run of ``runs`` (a plugin's) if it changed; True if drawn."""
    name = dash.set_runs({k: str(r.info.get("strategy", "")) for k, r in runs.items()})
    if name is None:
        return False
    if name not in runs:  # dropped (daskpri.table.keep-closed): say so, keep its plots
        dash.status.gone(name)
        return False
    args = dash.request()
    run, base = runs[name], runs.get(args["baseline_name"] or "")
    # Computing a snapshot is O(samples): skip it while nothing moved.
    seen = (
        name,
        run.last_step,
        run.closed,  # a run closes without a step: the page must still say so
        run.owner.tobytes(),  # so does a worker leave (its partitions move): drop its bar
        run.table.n_updates,
        len(run.metrics),
        args["baseline_name"],
        None if base is None else len(base.metrics),
    )
    if seen == dash.seen:
        return False
    dash.show(
        snapshot_from_run(
            run,
            args["start_histogram"],
            name=name,
            cursor=args["cursor"],
            baseline=base,
            baseline_name=args["baseline_name"] if base is not None else None,
            baseline_cursor=args["baseline_cursor"],
        )
    )
    dash.seen = seen
    return True


def daskpri_doc(scheduler: Any, extra: dict[str, Any], doc: Document) -> None:
    """The ``/daskpri`` Bokeh document, in the scheduler's process.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler; its ``"daskpri"`` plugin is read at every refresh
        (the plugin may be replaced or come later).
    extra : dict
        Template variables of distributed's dashboard (prefix, navigation).
    doc : bokeh.document.Document
        The session's document.
    """
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    dash = DaskpriDashboard()

    def refresh() -> None:
        plugin = scheduler.plugins.get(PLUGIN_NAME)
        refresh_from_runs(dash, getattr(plugin, "runs", {}))

    refresh()
    doc.add_periodic_callback(refresh, INTERVAL)
    doc.title = "Dask: daskpri"
    doc.add_root(dash.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def install(scheduler: Any) -> bool:
    """Serve ``/daskpri`` on the scheduler's dashboard; idempotent.

    Adds a Bokeh application for the page to the scheduler's running HTTP
    application, and ``daskpri`` to the navigation bar that distributed's
    pages share. Must run on the scheduler's event loop (as a plugin's
    ``start`` does). It adds the ``daskpri_view`` handler that the
    standalone page reads (:func:`~daskpri.dashboard.snapshot.add_view_handler`)
    in any case.

    Returns
    -------
    bool
        True if the page is served; False where the scheduler serves no
        Bokeh dashboard (``dashboard=False``, no HTTP server, or no suitable
        Bokeh), which is not an error.
    """
    # the standalone page's handler, first: it serves schedulers without a dashboard too
    add_view_handler(scheduler)
    http_app = getattr(scheduler, "http_application", None)
    if http_app is None or getattr(scheduler, "http_server", None) is None:
        logger.debug("daskpri: the scheduler has no HTTP server; no /daskpri page")
        return False
    try:
        from bokeh.server.server import BokehTornado
        from distributed.dashboard.core import BokehApplication
        from distributed.dashboard.scheduler import template_variables
    except ImportError as e:  # distributed refuses Bokeh versions it does not support
        logger.debug("daskpri: no Bokeh dashboard (%s); no /daskpri page", e)
        return False
    from tornado.ioloop import IOLoop

    bokeh_apps = [a for a in http_app.applications if isinstance(a, BokehTornado)]
    if not bokeh_apps:
        logger.debug("daskpri: the scheduler's dashboard is off; no /daskpri page")
        return False
    # Every page of distributed's dashboard renders its navigation bar from
    # this list (memoized per scheduler, shared by its documents).
    variables = template_variables(scheduler)
    if PAGE not in variables["pages"]:
        variables["pages"].append(PAGE)
    if any(ROUTE in app.app_paths for app in bokeh_apps):
        return True
    # The page shares the dashboard's prefix, so its relative links (Bokeh's
    # static files, the navigation bar) resolve as on distributed's pages.
    app = BokehApplication(
        {ROUTE: daskpri_doc},
        scheduler,
        prefix=bokeh_apps[0].prefix,
        template_variables=variables,
    )
    http_app.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    logger.info("daskpri: dashboard page at %s", ROUTE)
    return True
