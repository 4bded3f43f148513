"""The daskpri dashboard as a standalone Bokeh app, fed by a scheduler's RPC.

Either with Bokeh's server (pass ``--address 127.0.0.1``: ``bokeh serve``
listens on every interface unless told)::

    bokeh serve dashboards/daskpri_app.py --address 127.0.0.1 --args --scheduler tcp://127.0.0.1:8786

or on its own, listening on 127.0.0.1 by default, at ``/daskpri``::

    python dashboards/daskpri_app.py --scheduler tcp://127.0.0.1:8786 [--port 5006]

A ``tls://`` scheduler takes ``--tls-ca-file``, ``--tls-cert`` and
``--tls-key`` (or Dask's TLS config), as ``daskpri dashboard`` does.

The scheduler needs the daskpri plugin: ``dask scheduler --preload
daskpri.table.plugin``, or any scheduler a daskpri Trainer has run on.
"""

from __future__ import annotations

import sys

from daskpri.dashboard.remote import main, parse_args, remote_doc

if __name__ == "__main__":
    main()
else:  # under ``bokeh serve``, which sets sys.argv to the script and its --args
    from bokeh.io import curdoc

    try:
        args = parse_args(sys.argv[1:])
    except SystemExit:  # argparse's exit would end the whole server, not this page
        raise RuntimeError(
            "daskpri_app.py needs the scheduler's address: bokeh serve dashboards/daskpri_app.py "
            "--address 127.0.0.1 --args --scheduler tcp://127.0.0.1:8786"
        ) from None
    from daskpri.cli._tls import client_security

    # the --tls-* files, checked as `daskpri dashboard` checks them
    remote_doc(args.scheduler, curdoc(), security=client_security(args))
