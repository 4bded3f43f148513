"""Shared looks of the dashboard's figures."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bokeh.models import ColumnDataSource, DataRange1d, Range1d
from bokeh.models.annotations import Title
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

#: Colors of the run and of its baseline.
RUN_COLOR, BASELINE_COLOR = Category10_10[0], Category10_10[7]
#: Colors of the parts of a step's time, in the order of ``daskpri.training.history.TIME_PARTS``.
TIME_COLORS = (Category10_10[2], Category10_10[1], Category10_10[4], Category10_10[9])
TOOLS = "pan,wheel_zoom,box_zoom,reset,save"


def new_figure(title: str, **kwargs: Any) -> Any:
    """A figure of the dashboard's size and tools, without the Bokeh logo."""
    opts: dict[str, Any] = {
        "height": 280,
        "width": 560,
        "tools": TOOLS,
        "toolbar_location": "above",
    }
    opts.update(kwargs)
    # a Title, not its text: distributed's pages turn Bokeh's validation off as they
    # draw, for the whole process, and Bokeh makes a Title of a string only with it on
    fig = figure(title=Title(text=title), **opts)
    fig.toolbar.logo = None
    return fig


def empty(source: ColumnDataSource) -> dict[str, list]:
    """Empty columns for ``source``."""
    return {k: [] for k in source.data}


def fit_ranges(figures: Iterable[Any], y_start: float | None = None) -> None:
    """Data ranges where ``figures`` have data to fit; fixed ranges, 0 to 1, where not.

    BokehJS cannot fit a data range to no data: it warns "could not set
    initial ranges" in the browser's console at each draw of such a figure
    (every dashboard figure, before the first snapshot; the speedup's, for
    good, without a baseline). A range shared by several figures (the
    curves' time) fits the data of all. ``y_start`` pins the data ranges'
    start on the vertical axes (0 for counts and times).
    """
    figs = list(figures)
    for dim, start in (("x_range", None), ("y_range", y_start)):
        for rng in {id(getattr(f, dim)): getattr(f, dim) for f in figs}.values():
            users = [f for f in figs if getattr(f, dim) is rng]
            has_data = any(_n_rows(r) for f in users for r in f.renderers)
            if has_data == isinstance(rng, DataRange1d):
                continue
            new: Any
            if not has_data:
                new = Range1d(start=0.0 if start is None else start, end=1.0)
            elif start is None:
                new = DataRange1d()
            else:
                new = DataRange1d(start=start)
            for f in users:
                setattr(f, dim, new)


def _n_rows(renderer: Any) -> int:
    data = getattr(getattr(renderer, "data_source", None), "data", None) or {}
    return len(next(iter(data.values()), ()))
