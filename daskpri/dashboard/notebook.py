"""The ``/daskpri`` page in a notebook: an inline frame, or its address elsewhere.

The page is served by the scheduler's own dashboard (see
:mod:`daskpri.dashboard.page`), so the frame only points the browser at it:
nothing is drawn by the kernel and the browser never talks to the driver.

Examples
--------
>>> from distributed import Client, LocalCluster
>>> cluster = LocalCluster(host="127.0.0.1", dashboard_address="127.0.0.1:0")  # doctest: +SKIP
>>> client = Client(cluster)  # doctest: +SKIP
>>> show(client)  # doctest: +SKIP
daskpri dashboard: http://127.0.0.1:41235/daskpri
'http://127.0.0.1:41235/daskpri'
"""

from __future__ import annotations

from typing import Any

from distributed import Client

__all__ = ["bokeh_pages", "dashboard_url", "in_jupyter", "page_url", "show"]

#: The path of distributed's own status page, which the dashboard link names.
_STATUS = "/status"
#: The page's path (:data:`daskpri.dashboard.page.ROUTE`, which imports Bokeh's models)
_ROUTE = "/daskpri"


def dashboard_url(client: Client) -> str:
    """The address of the ``/daskpri`` page of ``client``'s scheduler.

    It is ``client.dashboard_link`` with its trailing ``/status`` replaced by
    ``/daskpri``, so that a link template set in the
    ``distributed.dashboard.link`` config (a JupyterHub proxy, say) applies
    to this page too.

    Parameters
    ----------
    client : distributed.Client
        A client connected to the scheduler.

    Returns
    -------
    str

    Raises
    ------
    TypeError
        If ``client`` is not a ``distributed.Client``.
    RuntimeError
        If the scheduler serves no Bokeh dashboard (``dask scheduler
        --no-dashboard``, or no Bokeh where it runs): its HTTP server then
        answers ``/health`` and ``/metrics`` on the dashboard's port, and
        ``client.dashboard_link`` names a page that is not there.

    Examples
    --------
    >>> dashboard_url(client)  # doctest: +SKIP
    'http://127.0.0.1:8787/daskpri'
    """
    if not isinstance(client, Client):
        raise TypeError(f"client should be a distributed.Client, but got {type(client).__name__}")
    link = _link(client)
    if link is None or bokeh_pages(client) is None:
        raise RuntimeError(
            "the scheduler serves no Bokeh dashboard, so there is no /daskpri page: start it "
            "with one (dask scheduler without --no-dashboard, or LocalCluster(dashboard_address="
            "'127.0.0.1:0')) and with bokeh installed in its environment, or serve the page "
            f"from this machine with `daskpri dashboard --scheduler {client.scheduler.address}`"
        )
    return page_url(link)


def page_url(link: str) -> str:
    """The ``/daskpri`` page beside the dashboard page ``link`` names.

    Examples
    --------
    >>> page_url("http://127.0.0.1:8787/status")
    'http://127.0.0.1:8787/daskpri'
    >>> page_url("https://hub.example.org/user/me/proxy/8787/status/")
    'https://hub.example.org/user/me/proxy/8787/daskpri'
    """
    base = str(link).rstrip("/")
    if base.endswith(_STATUS):
        base = base[: -len(_STATUS)]
    return f"{base}{_ROUTE}"


def bokeh_pages(client: Client) -> list[str] | None:
    """The paths of the Bokeh pages ``client``'s scheduler serves now (``None``: it serves none).

    The scheduler answers this, not its ``services``: one started with
    ``--no-dashboard`` still lists a ``dashboard`` service, its HTTP server
    of ``/health`` and ``/metrics``. ``/daskpri`` is among the paths once
    daskpri's table plugin is registered there (a trainer's first fit, or
    ``--preload daskpri.table.plugin``).

    Examples
    --------
    >>> "/status" in bokeh_pages(client)  # doctest: +SKIP
    True
    """

    # Nested, so cloudpickle sends it by value: a scheduler without daskpri
    # installed answers it too (its own error comes when a run starts).
    def pages(dask_scheduler: Any) -> list[str] | None:
        try:
            from bokeh.server.server import BokehTornado
        except ImportError:  # then distributed serves no Bokeh page either
            return None
        http_app = getattr(dask_scheduler, "http_application", None)
        found = [path for app in getattr(http_app, "applications", ())
                 if isinstance(app, BokehTornado) for path in app.app_paths]
        return sorted(found) or None

    result: list[str] | None = client.run_on_scheduler(pages)
    return result


def _link(client: Client) -> str | None:
    """``client.dashboard_link``, or ``None`` where the scheduler has no HTTP server."""
    try:
        link = client.dashboard_link
    except KeyError:  # a scheduler without an HTTP server lists no dashboard service
        return None
    return str(link) if link else None


def in_jupyter() -> bool:
    """Whether this code runs in a Jupyter kernel (not a plain IPython or Python).

    Examples
    --------
    >>> in_jupyter()
    False
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    # Only kernels (ipykernel's ZMQInteractiveShell) have a ``kernel``: a
    # terminal IPython cannot show a frame.
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(client: Client, *, height: int = 900) -> Any:
    """Show the live ``/daskpri`` page of ``client``'s cluster.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster that trains (``trainer.client``).
    height : int, default 900
        Height of the frame in pixels (the page is about 1,300 pixels tall:
        the frame scrolls).

    Returns
    -------
    IPython.display.IFrame or str
        In a Jupyter kernel, a frame of the page, drawn when it is the
        value of a cell (or passed to ``display``); elsewhere, the page's
        address, which is also printed.

    Raises
    ------
    TypeError, ValueError
        If ``client`` is not a ``distributed.Client`` or ``height`` not a
        positive integer.
    RuntimeError
        If the scheduler serves no Bokeh dashboard (so no ``/daskpri`` page).

    Notes
    -----
    The page is served by daskpri's scheduler plugin
    (:class:`daskpri.table.plugin.TablePlugin`), which ``show`` registers
    when the scheduler lacks it (as a trainer's first fit would), so the
    page exists before the first run; it follows the newest run. The
    frame's address is the scheduler's as the client sees it: on a remote
    cluster, forward the scheduler's and the dashboard's ports
    (``ssh -L 8786:127.0.0.1:8786 -L 8787:127.0.0.1:8787 host``) and connect
    the client through the tunnel, or set ``distributed.dashboard.link``.

    Examples
    --------
    >>> show(client)  # doctest: +SKIP
    daskpri dashboard: http://127.0.0.1:8787/daskpri
    'http://127.0.0.1:8787/daskpri'
    """
    if isinstance(height, bool) or not isinstance(height, int) or height < 1:
        raise ValueError(f"height should be a positive integer, but got height={height!r}")
    url = dashboard_url(client)  # refuses a scheduler without Bokeh's pages
    from daskpri.table.plugin import RemoteTable

    RemoteTable.ensure_plugin(client)
    if not client.run_on_scheduler(_serves_page):
        raise RuntimeError(
            f"the scheduler serves no Bokeh dashboard, so there is no page at {url}: start it "
            "with one (dask scheduler without --no-dashboard, LocalCluster(dashboard_address="
            "'127.0.0.1:0')) and with bokeh installed in its environment"
        )
    if in_jupyter():
        from IPython.display import IFrame

        return IFrame(url, width="100%", height=height)
    print(f"daskpri dashboard: {url}", flush=True)
    return url


def _serves_page(dask_scheduler: Any) -> bool:
    """Whether the scheduler's dashboard serves ``/daskpri`` (run on the scheduler)."""
    try:
        from bokeh.server.server import BokehTornado

        from daskpri.dashboard.page import ROUTE
    except ImportError:
        return False
    http_app = getattr(dask_scheduler, "http_application", None)
    return http_app is not None and any(
        isinstance(app, BokehTornado) and ROUTE in app.app_paths for app in http_app.applications
    )
