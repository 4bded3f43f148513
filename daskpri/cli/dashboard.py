"""``daskpri dashboard``: serve the live /daskpri page of a scheduler."""

from __future__ import annotations

import argparse
import errno
import socket

from distributed.comm.addressing import get_address_host_port

from daskpri import _config
from daskpri.cli._tls import client_security


def _dashboard_command(args: argparse.Namespace) -> int:
    from daskpri.dashboard.remote import make_server, warn_if_unreachable

    if not 0 <= args.port < 65536:
        raise ValueError(f"--port should be in [0, 65536), but got --port {args.port}")
    try:  # the page connects later, on its first refresh: a typo is told now
        _, port = get_address_host_port(args.scheduler)
        if not 0 < port < 65536:  # else said 'refused' on every refresh, for good
            raise ValueError(f"its port {port} is not in [1, 65536)")
    except ValueError as e:
        raise ValueError(
            f"--scheduler should be a scheduler's address such as tcp://127.0.0.1:8786, but "
            f"got --scheduler {args.scheduler!r} ({e})"
        ) from None
    security = client_security(args)
    try:
        server = make_server(args.scheduler, address=args.address, port=args.port,
                             security=security)
    except OSError as e:
        if e.errno not in (errno.EADDRINUSE, errno.EACCES):  # taken, or privileged
            raise
        where = _config.get("dashboard.address", args.address)
        raise ValueError(
            f"--port {args.port} cannot be listened on at {where}: {e.strerror}; give "
            "another --port, or --port 0 for any free one"
        ) from None
    server.start()
    print(f"daskpri dashboard: {_page_url(server.address, server.port)}", flush=True)
    # told on the terminal too, where the page would say it only once opened
    server.io_loop.add_callback(warn_if_unreachable, args.scheduler, security=security)
    try:
        server.io_loop.start()
    finally:
        server.stop()
    return 0


def _page_url(address: str, port: int) -> str:
    """The page's URL on a server listening on ``address``: by this machine's name on all.

    Examples
    --------
    >>> _page_url("127.0.0.1", 5006)
    'http://127.0.0.1:5006/daskpri'
    >>> _page_url("::1", 5006)
    'http://[::1]:5006/daskpri'
    >>> _page_url("0.0.0.0", 5006) == f"http://{socket.gethostname()}:5006/daskpri"
    True
    """
    from daskpri.dashboard.remote import ROUTE

    host = socket.gethostname() if address in ("0.0.0.0", "::", "") else address
    if ":" in host:  # an IPv6 address, bracketed in a URL
        host = f"[{host}]"
    return f"http://{host}:{port}{ROUTE}"
