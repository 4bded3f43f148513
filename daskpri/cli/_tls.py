"""The ``--tls-*`` options of the commands that connect to a scheduler, and their checks.

``train``, ``dashboard`` and ``bench`` take the same three files; each is
checked before any connection, so that a missing or unreadable file is
named rather than told as a scheduler that cannot be reached.
"""

from __future__ import annotations

import argparse
import os
import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed.security import Security


def add_tls_arguments(group: Any) -> None:
    """Add ``--tls-ca-file``, ``--tls-cert`` and ``--tls-key`` to ``group``.

    ``group`` is an :class:`argparse.ArgumentParser` or one of its argument
    groups.
    """
    group.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate of the cluster")
    group.add_argument("--tls-cert", metavar="PEM", help="this client's certificate")
    group.add_argument("--tls-key", metavar="PEM", help="this client's private key")


def client_security(args: argparse.Namespace, *, local_tls: str | None = None) -> Security | None:
    """The client's TLS credentials from ``--tls-*``, checked before any connection.

    ``None`` without them: Dask's config then gives a ``tls://`` scheduler's,
    if it has them; a ``tls://`` ``--scheduler`` with neither is refused
    here. ``local_tls`` is the command's flag for a LocalCluster with TLS
    (``train --tls``), named where the files are given without
    ``--scheduler``.

    Raises
    ------
    ValueError
        If the files are given without ``--scheduler`` or not all three, if
        one is missing, unreadable or not one ssl can load, or if a
        ``tls://`` scheduler has neither the files nor Dask's TLS config.
    """
    from distributed.security import Security

    from daskpri.training.cluster import lacks_tls_credentials

    scheduler = args.scheduler
    flags = {"--tls-ca-file": args.tls_ca_file, "--tls-cert": args.tls_cert,
             "--tls-key": args.tls_key}
    if any(flags.values()) and (scheduler is None or not all(flags.values())):
        raise ValueError(
            "--tls-ca-file, --tls-cert and --tls-key go together, with --scheduler"
            + (f"; for a LocalCluster with TLS, use {local_tls}" if local_tls else "")
        )
    if scheduler is None:
        return None
    if not any(flags.values()):
        if lacks_tls_credentials(scheduler):
            raise ValueError(
                "a tls:// scheduler needs --tls-ca-file, --tls-cert and --tls-key (or Dask's "
                "config distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
                f"distributed.comm.tls.client.key), but got --scheduler {scheduler} "
                "without them"
            )
        return None
    for flag, path in flags.items():
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            why = ("does not exist" if not os.path.lexists(path)
                   else "is not a file" if not os.path.isfile(path) else "is not readable")
            raise ValueError(
                f"{flag} should be a readable PEM file, but got {flag} {path!r}, which {why}"
            )
    # loaded now, so that a file ssl cannot read is named rather than told as
    # a scheduler that cannot be reached
    try:
        context = ssl.create_default_context(cafile=args.tls_ca_file)
    except ssl.SSLError as e:
        raise ValueError(
            f"--tls-ca-file {args.tls_ca_file!r} holds no CA certificate ssl can read ({e})"
        ) from None
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    except ssl.SSLError as e:
        raise ValueError(
            f"--tls-cert {args.tls_cert!r} and --tls-key {args.tls_key!r} are not a "
            f"certificate and its private key that ssl can load ({e})"
        ) from None
    return Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                    tls_client_key=args.tls_key, require_encryption=True)
