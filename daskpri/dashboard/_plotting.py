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


def fit_ranges(
    figures: Iterable[Any], y_start: float | None = None, *, rows: dict[int, int] | None = None
) -> None:
    """Data ranges where ``figures`` have data to fit; fixed ranges, 0 to 1, where not.

    BokehJS cannot fit a data range to no data: it warns "could not set
    initial ranges" in the browser's console at each draw of such a figure
    (every dashboard figure, before the first snapshot; the speedup's, for
    good, without a baseline). A range shared by several figures (the
    curves' time) fits the data of all. ``y_start`` pins the data ranges'
    start on the vertical axes (0 for counts and times). ``rows`` gives the
    rows that sources (by ``id``) are about to hold (see :func:`replace_data`).
    """
    figs = list(figures)
    for dim, start in (("x_range", None), ("y_range", y_start)):
        for rng in {id(getattr(f, dim)): getattr(f, dim) for f in figs}.values():
            # (rows to come, rows now) of each figure
            own = {id(f): (sum(_n_rows(r, rows or {}) for r in f.renderers),
                           sum(_n_rows(r, {}) for r in f.renderers)) for f in figs}
            # figures with data of their own first onto a data range, last off one: a
            # data range shared halfway through must have data to fit (see replace_data)
            users = sorted((f for f in figs if getattr(f, dim) is rng),
                           key=lambda f: own[id(f)], reverse=not isinstance(rng, DataRange1d))
            has_data = any(own[id(f)][0] for f in users)
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


def replace_data(
    source: ColumnDataSource,
    data: dict[str, Any],
    figures: Iterable[Any],
    y_start: float | None = None,
) -> None:
    """``source.data = data``; where that leaves ``figures`` without data, their ranges fixed first.

    Bokeh's server sends each change to the browser in a message of its
    own, and the browser may draw between two: emptied first, a data range
    would be drawn once with nothing to fit (see :func:`fit_ranges`). The
    caller fits the ranges again once the new data are in.
    """
    n = len(next(iter(data.values()), ()))
    if n == 0:
        fit_ranges(figures, y_start, rows={id(source): 0})
    source.data = data


def _n_rows(renderer: Any, rows: dict[int, int]) -> int:
    source = getattr(renderer, "data_source", None)
    if id(source) in rows:
        return rows[id(source)]
    data = getattr(source, "data", None) or {}
    return len(next(iter(data.values()), ()))
