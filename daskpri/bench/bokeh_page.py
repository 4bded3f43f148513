"""The report's plots as one standalone Bokeh page (resources inline: no CDN)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from daskpri.bench.config import BenchConfig
from daskpri.bench.figures import accuracy_lines, palette, scaling_points, speedup_bars
from daskpri.bench.records import RunRecord
from daskpri.data.store import write_atomic

__all__ = ["write_html"]


def write_html(path: Path, config: BenchConfig, records: Sequence[RunRecord],
               summary: Mapping[str, Any]) -> None:
    """Write the accuracy, speedup and scaling plots into ``path``, a standalone page."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models.widgets import Div
    from bokeh.resources import INLINE

    items: list[Any] = [Div(text="<h1>daskpri bench</h1><p>Tables: results.md; "
                                 "data: results.json.</p>")]
    for dataset in config.datasets:
        for model in config.models:
            items.append(_accuracy(config, records, summary, dataset, model))
    for (dataset, model), rows in speedup_bars(summary).items():
        items.append(_speedup(dataset, model, rows))
    if len(config.workers) > 1:
        items.append(_scaling(summary))
    page = file_html(column(*items), INLINE, title="daskpri bench")
    write_atomic(path, page)


def _accuracy(config: BenchConfig, records: Sequence[RunRecord], summary: Mapping[str, Any],
              dataset: str, model: str) -> Any:
    from bokeh.models.annotations import Span
    from bokeh.plotting import figure

    lines = accuracy_lines(config, records, dataset, model)
    colors = palette(list(dict.fromkeys(line.arm for line in lines)))
    fig = figure(title=f"{dataset} / {model}: test accuracy, {config.main_workers} worker(s)",
                 x_axis_label="training time (s)", y_axis_label="test accuracy",
                 width=800, height=400, tools="pan,wheel_zoom,box_zoom,reset,hover,save",
                 tooltips=[("arm", "$name"), ("time", "$x{0.0} s"), ("accuracy", "$y{0.0000}")])
    for line in lines:
        fig.line(line.time.tolist(), line.accuracy.tolist(), color=colors[line.arm],
                 line_alpha=1.0 if line.first else 0.45, line_width=1.5, name=line.arm,
                 legend_label=line.arm)
    for t in summary["targets"]:
        if (t["dataset"], t["model"]) == (dataset, model):
            fig.add_layout(Span(location=t["target"], dimension="width", line_dash="dashed",
                                line_color="grey"))
    fig.legend.location = "bottom_right"
    fig.legend.click_policy = "hide"
    return fig


def _speedup(dataset: str, model: str, rows: Sequence[Mapping[str, Any]]) -> Any:
    from bokeh.models import ColumnDataSource, FactorRange
    from bokeh.models.annotations import Span, Whisker
    from bokeh.plotting import figure

    factors = [(r["arm"], r["target"]) for r in rows]
    source = ColumnDataSource({
        "x": factors, "value": [r["value"] for r in rows], "kind": [r["kind"] for r in rows],
        "low": [r["low"] for r in rows], "high": [r["high"] for r in rows],
    })
    fig = figure(x_range=FactorRange(factors=factors), width=800, height=320,
                 title=f"{dataset} / {model}: speedup vs uniform (time to target)",
                 y_axis_label="speedup", tooltips=[("", "@x"), ("speedup", "@value{0.00}x"),
                                                   ("interval", "@low{0.00}x–@high{0.00}x"),
                                                   ("kind", "@kind")])
    fig.vbar(x="x", top="value", width=0.8, source=source)
    # the bootstrap interval over seeds (NaN, not drawn, where there is none)
    fig.add_layout(Whisker(base="x", lower="low", upper="high", source=source))
    fig.add_layout(Span(location=1.0, dimension="width", line_color="black"))
    fig.xaxis.major_label_orientation = 0.8
    return fig


def _scaling(summary: Mapping[str, Any]) -> Any:
    from bokeh.plotting import figure

    points = scaling_points(summary)
    labels = list(dict.fromkeys(a for arms in points.values() for a in arms))
    colors = palette(labels)
    fig = figure(title="scaling: samples/s (dotted: linear)", x_axis_label="workers",
                 y_axis_label="samples/s (median)", width=800, height=400)
    for (dataset, model), arms in points.items():
        for arm, (workers, sps) in arms.items():
            label = f"{dataset}/{model} {arm}"
            fig.line(workers, sps, color=colors[arm], legend_label=label, line_width=2)
            fig.scatter(workers, sps, color=colors[arm], legend_label=label, size=7)
            fig.line(workers, [sps[0] * n / workers[0] for n in workers], color=colors[arm],
                     line_dash="dotted", legend_label=label)
    fig.legend.location = "top_left"
    return fig
