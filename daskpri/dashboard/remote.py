"""The dashboard outside the scheduler: a Bokeh server that asks it through RPC.

Where the scheduler's own dashboard is out of reach or off, the same page is
served by a separate Bokeh server (``dashboards/daskpri_app.py``), which
connects a Client to the scheduler and reads snapshots through the
``daskpri_*`` handlers of :class:`daskpri.table.plugin.TablePlugin`.

Examples
--------
>>> serve("tcp://127.0.0.1:8786", port=5006)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from bokeh.document import Document, without_document_lock
from distributed import Client
from distributed.security import Security

from daskpri import _config
from daskpri._warnings import warn
from daskpri.dashboard.page import INTERVAL, PAGE, ROUTE, DaskpriDashboard
from daskpri.dashboard.snapshot import NoPlugin, run_strategies, snapshot_from_rpc

logger = logging.getLogger(__name__)

_CONNECT_TIMEOUT = 10.0  # seconds to reach the scheduler before a refresh gives up
_BACKOFF = 5.0  # seconds between attempts while the scheduler or its table is not there
_PROBE_TIMEOUT = 3.0  # seconds for the scheduler to answer at start before it is said away
_HANDSHAKE_GRACE = 2.0  # seconds past a connect's timeout for the scheduler's handshake


def remote_doc(
    scheduler_address: str,
    doc: Document,
    interval: int = INTERVAL,
    connect_timeout: float = _CONNECT_TIMEOUT,
    security: Security | None = None,
) -> None:
    """Build the page in ``doc``, fed by the scheduler at ``scheduler_address``.

    The session connects its own asynchronous Client on its first refresh
    and closes it with the session. A refresh waits on the scheduler
    without the document's lock (connecting can take the whole connect
    timeout, ``connect_timeout`` seconds, while the scheduler is away), so
    the page's widgets answer meanwhile; it reads and changes the page in
    next-tick callbacks. While the scheduler cannot be reached, the page's
    status says so and why, and the refreshes keep trying. ``security``
    holds the Client's TLS credentials (``None``: Dask's config's).
    """
    dash = DaskpriDashboard()
    state: dict[str, Any] = {"client": None, "busy": False, "strategies": {}, "wait": 0.0,
                             "said": None}

    async def locked(fn: Callable[[], Any]) -> Any:
        """``fn()`` run under the document's lock, in a next-tick callback."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def run() -> None:
            if done.cancelled():
                return
            try:
                done.set_result(fn())
            except Exception as e:
                done.set_exception(e)

        doc.add_next_tick_callback(run)
        return await done

    def choose() -> tuple[str | None, dict[str, Any]]:
        dash.status.unreachable(None)
        name = dash.set_runs(state["strategies"])
        if name is None:
            return None, {}
        if name not in state["strategies"]:  # dropped: say so, keep its plots
            dash.status.gone(name)
            return None, {}
        return name, dash.request()

    @without_document_lock
    async def refresh() -> None:
        if state["busy"] or time.monotonic() < state["wait"]:  # waiting, or backing off
            return
        state["busy"] = True
        connecting = state["client"] is None
        try:
            if connecting:
                state["client"] = await Client(
                    scheduler_address, asynchronous=True, set_as_default=False,
                    timeout=connect_timeout, security=security,
                )
                connecting = False  # reached: what fails from here is no connect's error
            rpc = state["client"].scheduler
            state["strategies"] = await run_strategies(rpc, state["strategies"])
            name, args = await locked(choose)
            if name is None:
                return
            snap = await snapshot_from_rpc(
                rpc,
                name,
                args["start_histogram"],
                cursor=args["cursor"],
                baseline=args["baseline_name"],
                baseline_cursor=args["baseline_cursor"],
                previous=args["previous"],
            )
            await locked(partial(dash.show, snap))
            state["said"] = None
        except Exception as e:  # a run closed meanwhile, no table yet, or no scheduler
            client = state["client"]
            if client is not None and client.status != "running":
                state["client"] = None  # closed by distributed: connect afresh later
                asyncio.ensure_future(client.close())
            if not isinstance(e, KeyError) or isinstance(e, NoPlugin):
                state["wait"] = time.monotonic() + _BACKOFF  # again later, not every refresh
            said = f"{type(e).__name__}: {e}"
            if said != state["said"]:  # once, not on every refresh
                logger.info("daskpri dashboard: %s: %s", scheduler_address, said)
                state["said"] = said
            # not a run closed or no table yet (the page says those itself): the
            # scheduler could not be reached, or went away
            away = connecting or isinstance(e, OSError)  # a closed comm, a timeout
            await locked(partial(dash.status.unreachable, _reason(e) if away else None))
        finally:
            state["busy"] = False

    def close_client(session_context: Any) -> None:
        if state["client"] is not None:
            asyncio.ensure_future(state["client"].close())

    # Bokeh runs coroutine callbacks on its loop; its annotation says plain functions.
    doc.add_next_tick_callback(refresh)  # type: ignore[arg-type]
    doc.add_periodic_callback(refresh, interval)  # type: ignore[arg-type]
    doc.on_session_destroyed(close_client)
    doc.title = f"daskpri: {scheduler_address}"
    doc.add_root(dash.root)


def _reason(error: BaseException) -> str:
    """Why the scheduler could not be reached, in one line: ``error`` and its cause.

    Dask's connect retries until its timeout and says only that it timed
    out; the last attempt's error (a refused connection) is its cause.

    Examples
    --------
    >>> try:
    ...     raise OSError("Timed out after 2 s") from ConnectionRefusedError("refused")
    ... except OSError as e:
    ...     _reason(e)
    'Timed out after 2 s: ConnectionRefusedError: refused'
    """
    why = str(error) or type(error).__name__
    cause = error.__cause__
    if cause is not None:
        text = str(cause)
        if ">: " in text:  # distributed's comm errors: "in <its connector>: Error: why"
            why = f"{why}: {text.rpartition('>: ')[2]}"
        else:
            why = f"{why}: {type(cause).__name__}" + (f": {text}" if text else "")
    return " ".join(why.split())


async def unreachable(
    scheduler_address: str, timeout: float, security: Security | None = None
) -> str | None:
    """Why the scheduler at ``scheduler_address`` cannot be reached now, or ``None``.

    One connection and Dask's handshake, given ``timeout`` seconds (and a
    little more for the handshake, which Dask waits for without one), with
    the TLS credentials ``security`` (``None``: Dask's config's), as the
    page's Client has.
    """
    from distributed.comm import connect

    args = (security or Security()).get_connection_args("client")
    try:
        comm = await asyncio.wait_for(
            connect(scheduler_address, timeout=timeout, **args), timeout + _HANDSHAKE_GRACE
        )
    except TimeoutError:  # the handshake's wait: Dask's own connect says OSError
        return f"no answer within {timeout + _HANDSHAKE_GRACE:g} s"
    except Exception as e:
        return _reason(e)
    await comm.close()
    return None


async def warn_if_unreachable(
    scheduler_address: str, timeout: float = _PROBE_TIMEOUT, security: Security | None = None
) -> None:
    """Warn, once, if the scheduler cannot be reached now; the page keeps trying meanwhile.

    A dashboard may well start before its scheduler: this is no error.
    """
    why = await unreachable(scheduler_address, timeout, security)
    if why is not None:
        warn(
            f"could not reach the scheduler at {scheduler_address} now ({why}); "
            "the page will keep trying"
        )


def make_server(
    scheduler_address: str,
    *,
    address: str | None = None,
    port: int = 5006,
    connect_timeout: float = _CONNECT_TIMEOUT,
    security: Security | None = None,
    **kwargs: Any,
) -> Any:
    """A Bokeh server of the page at ``/daskpri``, not started.

    Parameters
    ----------
    scheduler_address : str
        The Dask scheduler, e.g. ``tcp://127.0.0.1:8786``.
    address : str, optional
        The interface to listen on; by default ``daskpri.dashboard.address``
        in the config (``127.0.0.1``).
    port : int
        The port (0: a free one).
    connect_timeout : float
        Seconds each page waits for the scheduler per attempt to connect.
    security : distributed.security.Security, optional
        The pages' TLS credentials for a ``tls://`` scheduler; ``None``
        takes those of Dask's config.
    **kwargs
        More options of :class:`bokeh.server.server.Server`.
    """
    from bokeh.application import Application
    from bokeh.application.handlers.function import FunctionHandler
    from bokeh.server.server import Server
    from distributed.utils import open_port

    address = _config.get("dashboard.address", address)
    if port == 0:  # the websocket origins below need the port before Bokeh binds it
        port = open_port(address)
    kwargs.setdefault("allow_websocket_origin", _origins(address, port))
    app = Application(FunctionHandler(
        partial(remote_doc, scheduler_address, connect_timeout=connect_timeout,
                security=security)
    ))
    return Server({ROUTE: app}, address=address, port=port, **kwargs)


def _origins(address: str, port: int) -> list[str]:
    """The pages' origins whose websocket the server takes: the names it is reached by.

    Bokeh refuses a websocket from any other origin: the page would load,
    then stay empty. Listening on every interface (``0.0.0.0``, ``::``), the
    server is reached by this machine's names and the IPv4 addresses its
    name resolves to too.
    """
    hosts = {address, "localhost"}
    if address in ("0.0.0.0", "::", ""):
        hosts |= {"127.0.0.1", socket.gethostname(), socket.getfqdn()}
        try:
            found = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        except OSError:  # a name that does not resolve: reached by the others
            found = []
        hosts |= {str(info[4][0]) for info in found}
    return sorted(f"{host}:{port}" for host in hosts if host)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the page until interrupted: ``python dashboards/daskpri_app.py --scheduler ADDR``."""
    from daskpri.cli import _show_warning
    from daskpri.cli.dashboard import _dashboard_command

    args = parse_args(argv)
    with warnings.catch_warnings():  # as `daskpri dashboard` shows them: a line each
        warnings.showwarning = _show_warning
        try:  # `daskpri dashboard`'s checks, server and terminal lines
            _dashboard_command(args)
        except (ValueError, OSError) as e:
            raise SystemExit(f"{PAGE}: error: {e}") from None
        except KeyboardInterrupt:
            pass  # Ctrl-C: the server stops with the process


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The standalone app's arguments (``--scheduler``, ``--address``, ``--port``, ``--tls-*``)."""
    from daskpri.cli._tls import add_tls_arguments

    parser = argparse.ArgumentParser(
        prog=PAGE, description="Serve the daskpri dashboard of a Dask scheduler."
    )
    parser.add_argument("--scheduler", required=True, help="scheduler address, tcp://host:8786")
    parser.add_argument(
        "--address", default=None, help="interface to listen on (default: 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=5006,
                        help="port to listen on (default 5006)")
    add_tls_arguments(parser.add_argument_group("TLS (with a tls:// --scheduler)"))
    return parser.parse_args(argv)
