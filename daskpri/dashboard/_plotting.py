"""Shared looks of the dashboard's figures."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource
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
    fig = figure(title=title, **opts)
    fig.toolbar.logo = None
    return fig


def empty(source: ColumnDataSource) -> dict[str, list]:
    """Empty columns for ``source``."""
    return {k: [] for k in source.data}
