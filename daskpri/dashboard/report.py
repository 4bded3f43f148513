"""A finished run's report: one static, self-contained HTML page from its history.

The page draws the history (and optionally a baseline's) with the live
dashboard's own components (:class:`~daskpri.dashboard.progress.TrainingCurves`,
:class:`~daskpri.dashboard.progress.Speedup`,
:class:`~daskpri.dashboard.progress.Workers`), fed one snapshot holding every
step, so the report and the ``/daskpri`` page look and measure alike. Bokeh's
JavaScript is inlined: the file opens offline and can be mailed or archived.

Examples
--------
>>> import numpy as np, xarray as xr, os, tempfile
>>> steps = np.arange(3)
>>> h = xr.Dataset(
...     {k: ("step", v) for k, v in {
...         "time": [0.1, 0.2, 0.3], "loss": [2.3, 2.0, 1.8],
...         "accuracy": [np.nan, np.nan, 0.4], "samples_per_second": [900.0] * 3,
...         "compute_time": [0.01] * 3, "communication_time": [0.02] * 3,
...         "selection_time": [0.003] * 3, "optimizer_time": [0.001] * 3}.items()},
...     coords={"step": steps}, attrs={"strategy": "uniform"})
>>> path = write_report(h, os.path.join(tempfile.mkdtemp(), "report.html"))
>>> path.endswith("report.html")
True
"""

from __future__ import annotations

import html
import math
import os
from typing import Any

import numpy as np
import xarray as xr

from daskpri.dashboard._plotting import BASELINE_COLOR, RUN_COLOR
from daskpri.dashboard.measures import speedup_curve
from daskpri.dashboard.snapshot import METRIC_COLUMNS, WORKER_COLUMNS
from daskpri.data.io import check_self_contained, format_of
from daskpri.data.store import write_atomic
from daskpri.training.history import TIME_PARTS

__all__ = ["REQUIRED_VARIABLES", "load_history", "write_report"]

#: The per-step variables a history needs for a report.
REQUIRED_VARIABLES: tuple[str, ...] = (
    "time",
    "loss",
    "accuracy",
    "samples_per_second",
    *TIME_PARTS,
)
#: Steps of the rolling mean drawn over the per-step samples/s.
_SMOOTH = 20


def load_history(
    source: xr.Dataset | str | os.PathLike[str], *, name: str = "history"
) -> xr.Dataset:
    """A run's history, in memory, checked to hold what a report draws.

    Parameters
    ----------
    source : xarray.Dataset, str or os.PathLike
        A history (``trainer.history_``), or the netCDF file or zarr store
        ``daskpri train --output`` wrote.
    name : str, default "history"
        The parameter's name, used in error messages.

    Returns
    -------
    xarray.Dataset
        Loaded into memory (a file is closed again).

    Raises
    ------
    TypeError
        If ``source`` is neither a Dataset nor a path.
    FileNotFoundError
        If the path does not exist.
    ValueError
        If the file cannot be read as netCDF or zarr, has no ``step``
        dimension or no step, or lacks one of `REQUIRED_VARIABLES` (named in
        the message).

    Examples
    --------
    >>> import xarray as xr
    >>> load_history(xr.Dataset({"time": ("step", [1.0])}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: history should have the per-step variable 'loss' ...
    """
    if isinstance(source, xr.Dataset):
        ds = source
    elif isinstance(source, (str, os.PathLike)):
        ds = _read(os.fspath(source), name=name)
    else:
        raise TypeError(
            f"{name} should be an xarray.Dataset or the path of a netCDF file or zarr store "
            f"written by `daskpri train --output`, but got {type(source).__name__}"
        )
    if "step" not in ds.dims:
        raise ValueError(
            f"{name} should have a 'step' dimension (a daskpri history), but got dimensions "
            f"{sorted(map(str, ds.dims))}"
        )
    for var in REQUIRED_VARIABLES:
        if var not in ds.variables or ds[var].dims != ("step",):
            have = ", ".join(sorted(str(v) for v in ds.data_vars)) or "none"
            raise ValueError(
                f"{name} should have the per-step variable {var!r} (along 'step'), as "
                f"trainer.history_ and `daskpri train --output` have it, but it is missing; "
                f"variables: {have}"
            )
    if ds.sizes["step"] == 0:
        raise ValueError(f"{name} has no step: nothing to report (fit for at least one step)")
    return ds


def write_report(
    history: xr.Dataset | str | os.PathLike[str],
    output_html: str | os.PathLike[str],
    *,
    baseline: xr.Dataset | str | os.PathLike[str] | None = None,
    title: str | None = None,
) -> str:
    """Write a static, self-contained HTML report of a finished run.

    The page shows a header with the run's attributes (strategy and its
    parameters, seed, workers, ...) and summary numbers, the training loss
    and accuracy against training time, samples per second, each step's time
    split into compute, communication, selection and optimizer, and the
    samples per second of each worker slot. With a ``baseline``, its curves
    are drawn beside the run's, with the speedup to each accuracy level both
    reached (:func:`daskpri.dashboard.measures.speedup_curve`).

    Parameters
    ----------
    history : xarray.Dataset or path
        The run's history (``trainer.history_``, or the netCDF file or zarr
        store written by ``daskpri train --output``).
    output_html : str or os.PathLike
        Where to write the page; written atomically (a temporary sibling
        renamed into place), its directory created if needed.
    baseline : xarray.Dataset or path, optional
        Another run's history to compare with (usually ``uniform``).
    title : str, optional
        The page's title; by default names the run's strategy.

    Returns
    -------
    str
        ``output_html``.

    Raises
    ------
    TypeError
        If a history is neither a Dataset nor a path, or ``output_html`` is
        not a path.
    FileNotFoundError
        If a history's file does not exist.
    ValueError
        If a history lacks a variable the report draws (the message names
        it), a file is not a readable history, or ``output_html`` is a
        directory or one of the histories.

    Examples
    --------
    >>> history = trainer.fit(train, eval_data=test, max_steps=500)  # doctest: +SKIP
    >>> write_report(history, "report.html", baseline="uniform.nc")  # doctest: +SKIP
    'report.html'
    """
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.resources import INLINE

    if not isinstance(output_html, (str, os.PathLike)):
        raise TypeError(f"output_html should be a path, but got {type(output_html).__name__}")
    if os.path.isdir(output_html):
        raise ValueError(f"output_html should be a file's path, but got "
                         f"{os.fspath(output_html)!r}, which is a directory")
    for name, source in (("history", history), ("baseline", baseline)):
        if isinstance(source, (str, os.PathLike)) and _same_path(source, output_html):
            raise ValueError(f"output_html {os.fspath(output_html)!r} is the {name} itself: "
                             "writing the page there would replace it; give another path")
    if os.path.isfile(output_html) and not _is_html(output_html):
        raise ValueError(f"output_html {os.fspath(output_html)!r} holds a file that is not an "
                         "HTML page: writing the report would replace it; give another path, "
                         "or remove the file first")
    run = load_history(history, name="history")
    base = None if baseline is None else load_history(baseline, name="baseline")
    if base is not None:
        differ = [f"{key} {base.attrs[key]!r} (the run's: {run.attrs[key]!r})"
                  for key in ("dataset", "model")
                  if key in run.attrs and key in base.attrs and run.attrs[key] != base.attrs[key]]
        if differ:
            raise ValueError(f"the baseline trained on other data or another model: "
                             f"{'; '.join(differ)}; its times to an accuracy compare with "
                             "nothing of the run's, give a baseline of the same dataset and model")
    run_name = _run_name(run, history, "run")
    base_name = None if base is None else _run_name(base, baseline, "baseline")
    if base_name == run_name:
        base_name = f"{base_name} (baseline)"
    page_title = title or f"daskpri report: {run.attrs.get('strategy', run_name)}"
    root = column(*_layout(run, run_name, base, base_name, page_title))
    document = file_html(root, INLINE, title=page_title)
    # atomic, and a write that fails (a full disk) names output_html, leaving nothing
    return write_atomic(os.fspath(output_html), document)


def _is_html(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` starts as an HTML page does (empty counts)."""
    with open(path, "rb") as f:
        head = f.read(512).lstrip().lower()
    return head == b"" or head.startswith((b"<!doctype html", b"<html"))


def _same_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """``a`` and ``b`` name the same file (or store), existing or not."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


# -- reading -------------------------------------------------------------------------


def _read(path: str, *, name: str) -> xr.Dataset:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} names {path!r}, but there is no such file or directory")
    fmt = format_of(path, name=name)
    if fmt != "zarr":
        try:  # a crafted history could pull another file's bytes into the page
            check_self_contained(path, name=name)
        except OSError:  # not HDF5 at all: xarray's error below says so
            pass
    try:
        if fmt == "zarr":
            with xr.open_zarr(path, consolidated=False) as ds:
                return ds.load()
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            return ds.load()
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(
            f"{name} {path!r} is not a readable {fmt} history ({type(e).__name__}: {e}); "
            "write one with `daskpri train --output run.nc` or to_store(trainer.history_, path)"
        ) from e


def _run_name(ds: xr.Dataset, source: Any, default: str) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.path.basename(os.fspath(source).rstrip("/" + os.sep)) or default
    return str(ds.attrs.get("strategy", default))


def _metrics(ds: xr.Dataset) -> dict[str, Any]:
    """A snapshot's ``metrics`` (see :mod:`daskpri.dashboard.snapshot`) of every step."""
    n = ds.sizes["step"]
    out: dict[str, Any] = {}
    for k in METRIC_COLUMNS:
        if k in ds.variables and ds[k].dims == ("step",):
            out[k] = np.asarray(ds[k].values, dtype=np.float64)
        else:
            out[k] = np.full(n, np.nan)
    for k in WORKER_COLUMNS:
        if k in ds.variables and ds[k].dims[:1] == ("step",) and ds[k].ndim == 2:
            rows = np.asarray(ds[k].values, dtype=np.float64)
            out[k] = [r[np.isfinite(r)].tolist() for r in rows]
        else:
            out[k] = [[] for _ in range(n)]
    return out


def _snapshot(
    run: xr.Dataset, run_name: str, base: xr.Dataset | None, base_name: str | None
) -> dict[str, Any]:
    """The part of a dashboard snapshot that the curves, speedup and workers draw."""
    return {
        "run": run_name,
        "strategy": str(run.attrs.get("strategy", "")),
        "metrics": _metrics(run),
        "baseline": None
        if base is None
        else {
            "run": base_name,
            "strategy": str(base.attrs.get("strategy", "")),
            "metrics": _metrics(base),
        },
    }


# -- the page ------------------------------------------------------------------------


def _layout(
    run: xr.Dataset,
    run_name: str,
    base: xr.Dataset | None,
    base_name: str | None,
    title: str,
) -> list[Any]:
    from bokeh.layouts import row
    from bokeh.models.widgets import Div

    from daskpri.dashboard.progress import Speedup, TrainingCurves, Workers

    snap = _snapshot(run, run_name, base, base_name)
    curves = TrainingCurves()
    curves.update(snap)
    _relabel(curves, run_name, base_name)
    n_steps = run.sizes["step"]
    workers = Workers(recent=n_steps, window=n_steps)
    workers.update(snap)
    workers.times_figure.title.text = "Step time, split (see the header for the means)"
    items: list[Any] = [
        Div(text=_header(run, run_name, base, base_name, title), width=1120),
        curves.root,
    ]
    throughput = _throughput(run, run_name, base, base_name)
    if base is not None:
        speedup = Speedup()
        speedup.update(snap)
        items.append(row(throughput, speedup.root))
    else:
        items.append(throughput)
    items.append(workers.root)
    return items


def _relabel(curves: Any, run_name: str, base_name: str | None) -> None:
    """Name the curves after the runs, and drop the baseline's legend without one."""
    from bokeh.core.properties import value

    for fig in (curves.loss_figure, curves.accuracy_figure):
        legend = fig.legend[0]
        kept = []
        for item in legend.items:
            label = getattr(item.label, "value", item.label)
            if label == "uniform baseline":
                if base_name is None:
                    continue
                item.label = value(f"baseline: {base_name}")
            elif label == "this run":
                item.label = value(run_name)
            kept.append(item)
        legend.items = kept
    vs = f" vs {base_name}" if base_name else ""
    curves.loss_figure.title.text = f"Training loss: {run_name}{vs}"
    curves.accuracy_figure.title.text = f"Accuracy on eval_data: {run_name}{vs}"


def _throughput(
    run: xr.Dataset, run_name: str, base: xr.Dataset | None, base_name: str | None
) -> Any:
    """Samples/s against training time: each step's, and a rolling mean."""
    from bokeh.models import ColumnDataSource, HoverTool

    from daskpri.dashboard._plotting import new_figure

    fig = new_figure(f"Samples/s (thin: each step; thick: mean of {_SMOOTH} steps)")
    runs = [(run, run_name, RUN_COLOR, "daskpri-report-samples-per-second")]
    if base is not None and base_name is not None:
        runs.append((base, base_name, BASELINE_COLOR, "daskpri-report-baseline-samples-per-second"))
    for ds, label, color, source_name in runs:
        rate = ds["samples_per_second"]
        mean = rate.rolling(step=min(_SMOOTH, ds.sizes["step"]), min_periods=1).mean()
        source = ColumnDataSource(
            {
                "time": ds["time"].values.tolist(),
                "step": ds["step"].values.tolist(),
                "samples_per_second": np.nan_to_num(rate.values).tolist(),
                "mean": np.nan_to_num(mean.values).tolist(),
            },
            name=source_name,
        )
        fig.line(source=source, x="time", y="samples_per_second", color=color, alpha=0.3)
        fig.line(source=source, x="time", y="mean", color=color, line_width=2, legend_label=label)
    fig.y_range.start = 0
    fig.xaxis.axis_label = "training time (s)"
    fig.yaxis.axis_label = "samples / s"
    fig.legend.location = "bottom_right"
    fig.legend.click_policy = "hide"
    fig.add_tools(
        HoverTool(
            tooltips=[
                ("step", "@step"),
                ("samples/s", "@samples_per_second{0,0}"),
                ("mean", "@mean{0,0}"),
                ("time", "@time{0.00} s"),
            ]
        )
    )
    return fig


def _split(ds: xr.Dataset) -> str:
    """The mean step time and its parts, in ms."""
    parts = {k: _nanmean(ds[k].values) for k in TIME_PARTS}
    total = sum(v for v in parts.values() if math.isfinite(v))
    split = " + ".join(
        f"{k.replace('_time', '')} {1e3 * v:.1f}" for k, v in parts.items() if math.isfinite(v)
    )
    return f"{1e3 * total:.1f} ms = {split} ms"


def _summary(ds: xr.Dataset) -> dict[str, str]:
    """The run's numbers at a glance, as display strings."""
    acc = ds["accuracy"].values
    evaluated = np.isfinite(acc)
    time = ds["time"].values
    out = {
        "steps": f"{ds.sizes['step']:,} (last step {int(ds['step'].values[-1]):,})",
        "training time": f"{_last(time):.1f} s",
        "final accuracy": f"{acc[evaluated][-1]:.4f}" if evaluated.any() else "not evaluated",
        "best accuracy": (
            f"{np.max(acc[evaluated]):.4f} at {time[evaluated][np.argmax(acc[evaluated])]:.1f} s"
            if evaluated.any()
            else "not evaluated"
        ),
        "final loss": f"{_last(ds['loss'].values):.4f}",
        "samples/s (mean)": f"{_nanmean(ds['samples_per_second'].values):,.0f}",
        "step time (mean)": _split(ds),
    }
    for var, label in (("samples", "samples processed"), ("grad_samples", "gradient samples")):
        if var in ds.variables and np.isfinite(ds[var].values).any():
            out[label] = f"{int(_last(ds[var].values)):,}"
    return out


def _header(
    run: xr.Dataset,
    run_name: str,
    base: xr.Dataset | None,
    base_name: str | None,
    title: str,
) -> str:
    parts = [f"<h1 style='margin: 0 0 8px 0'>{_esc(title)}</h1>"]
    names = [run_name] + ([base_name] if base_name is not None else [])
    datasets = [run] + ([base] if base is not None else [])
    attrs = list(dict.fromkeys(k for ds in datasets for k in ds.attrs))
    rows: list[tuple[str, list[Any]]] = [("run", names)]
    rows += [(k, [ds.attrs.get(k, "") for ds in datasets]) for k in attrs]
    summaries = [_summary(ds) for ds in datasets]
    rows += [(k, [s.get(k, "") for s in summaries]) for k in summaries[0]]
    parts.append(_table(rows))
    if base is not None:
        parts.append(_speedup_table(run, base, base_name or "baseline"))
    return "".join(parts)


def _speedup_table(run: xr.Dataset, base: xr.Dataset, base_name: str) -> str:
    curve = speedup_curve(
        run["time"].values, run["accuracy"].values, base["time"].values, base["accuracy"].values
    )
    if not len(curve["level"]):
        return f"<p>Speedup over {_esc(base_name)}: no accuracy level reached by both runs.</p>"
    # The plot has every level; the table, multiples of 0.05 and the highest level.
    keep = np.isclose(np.round(curve["level"] * 100) % 5, 0)
    keep[-1] = True
    curve = {k: v[keep] for k, v in curve.items()}
    rows: list[tuple[str, list[Any]]] = [
        (
            f"{level:.2f}",
            [f"{rt:.1f} s", f"{bt:.1f} s", f"{s:.2f}x"],
        )
        for level, rt, bt, s in zip(
            curve["level"],
            curve["run_time"],
            curve["baseline_time"],
            curve["speedup"],
            strict=True,
        )
    ]
    head = ("accuracy", ["run's time", f"{base_name}'s time", "speedup"])
    return (
        f"<h3 style='margin: 12px 0 4px 0'>Time to accuracy against {_esc(base_name)} "
        "(levels both runs reached: multiples of 0.05 and the highest)</h3>"
        + _table([head, *rows], header=True)
    )


def _table(rows: list[tuple[str, list[Any]]], *, header: bool = False) -> str:
    th = "text-align: left; font-weight: normal; color: #555; padding: 2px 10px"
    td = "padding: 2px 10px; border-bottom: 1px solid #eee; word-break: break-all"
    out = []
    for i, (key, values) in enumerate(rows):
        cell = "th" if header and i == 0 else "td"
        style = th if cell == "th" else td
        cells = "".join(f"<{cell} style='{style}'>{_esc(v)}</{cell}>" for v in values)
        out.append(f"<tr><th style='{th}'>{_esc(key)}</th>{cells}</tr>")
    return f"<table style='border-collapse: collapse'>{''.join(out)}</table>"


def _esc(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        value = f"{float(value):g}"
    return html.escape(str(value))


def _last(values: np.ndarray) -> float:
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite[-1]) if finite.size else math.nan


def _nanmean(values: np.ndarray) -> float:
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if finite.size else math.nan
