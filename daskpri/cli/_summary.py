"""What a run prints of itself: where its dashboard is, and its history in one line."""

from __future__ import annotations

import math

import numpy as np
import xarray as xr
from distributed import Client

from daskpri.dashboard.notebook import _link, bokeh_pages, page_url


def _dashboard(client: Client) -> str:
    """Where to watch the run on ``client``'s scheduler, after ``dashboard: ``.

    The dashboard's link where the scheduler serves Bokeh's pages (and the
    ``/daskpri`` page's, where it is registered already); else how to serve
    the page from this machine. A scheduler started with ``--no-dashboard``
    still has an HTTP server (``/health``, ``/metrics``), so
    ``client.dashboard_link`` names a page it does not serve: it is asked.
    """
    address = client.scheduler.address
    # the dashboard command takes the --tls-* options that reach a TLS scheduler
    none = _NONE.format(address=address, tls=" --tls-..." if address.startswith("tls://") else "")
    link = _link(client)
    try:
        pages = bokeh_pages(client)
    except Exception:  # one that refuses client.run_on_scheduler: its link, unchecked
        return link or none
    if link is None or pages is None:
        return none
    if "/daskpri" in pages:
        return f"{link} (daskpri's page: {page_url(link)})"
    return link


def _dashboard_lines(client: Client) -> list[str]:
    """What a run prints, before it starts, of where to watch it: a line each.

    ``dashboard: `` and :func:`_dashboard`'s words; then, where the scheduler
    serves Bokeh's pages but not ``/daskpri`` yet (its trainer adds the page
    as the run starts, just after), ``daskpri page: `` and the page's link,
    which is the one to open.
    """
    said = _dashboard(client)
    lines = [f"dashboard: {said}"]
    link = _link(client)
    if link is not None and said.startswith(link) and "daskpri's page" not in said:
        lines.append(f"daskpri page: {page_url(link)} (once the run starts)")
    return lines


#: what ``dashboard: `` says of a scheduler that serves no Bokeh pages
_NONE = ("none (the scheduler serves no dashboard; watch the run with "
         "`daskpri dashboard --scheduler {address}{tls}`)")


def _summary(history: xr.Dataset) -> str:
    """One line: strategy, steps, final and best accuracy, time, samples/s."""
    name = history.attrs.get("strategy", "run")
    if history.sizes["step"] == 0:
        return f"{name}: 0 steps"
    # a record per step, or per round of local steps: its last step is numbered
    steps = int(history["step"].values[-1]) + 1
    acc = history["accuracy"].values
    seen = acc[~np.isnan(acc)]
    final = seen[-1] if seen.size else math.nan
    best = seen.max() if seen.size else math.nan
    seconds = float(history["time"].values[-1])
    rate = float(history["samples"].values[-1]) / seconds if seconds > 0 else math.nan
    line = (
        f"{name}: {steps} steps, final accuracy {final:.4f}, best accuracy {best:.4f}, "
        f"{seconds:.1f} s training, {rate:,.0f} samples/s"
    )
    return line + _early_stopping(history)


def _early_stopping(history: xr.Dataset) -> str:
    """What the history's attributes say of its last fit's early stopping ("" where none).

    >>> h = xr.Dataset(attrs={"early_stopping": "EarlyStopping(...)", "monitor": "eval_loss",
    ...                       "best_step": 1, "stopped_step": 5, "restored_step": 1})
    >>> _early_stopping(h)
    '; early stopping: eval_loss not improved since step 1, stopped at step 5, step 1 restored'
    >>> _early_stopping(h.assign_attrs(stopped_step=-1, restored_step=-1))
    '; early stopping: best eval_loss at step 1'
    """
    attrs = history.attrs
    if "early_stopping" not in attrs:
        return ""
    monitor = attrs["monitor"]
    best, stopped = int(attrs["best_step"]), int(attrs["stopped_step"])
    if best < 0:
        return f"; early stopping: no finite {monitor} evaluated"
    if stopped >= 0:
        said = (f"; early stopping: {monitor} not improved since step {best}, stopped at "
                f"step {stopped}")
    else:
        said = f"; early stopping: best {monitor} at step {best}"
    if int(attrs["restored_step"]) >= 0:
        said += f", step {attrs['restored_step']} restored"
    return said
