"""Live Bokeh monitoring of daskpri runs.

The page ``/daskpri`` on the Dask scheduler's dashboard (installed by
:class:`daskpri.table.plugin.TablePlugin`) and the standalone Bokeh app
``dashboards/daskpri_app.py`` draw the same components
(:mod:`daskpri.dashboard.components`) from the same snapshots
(:mod:`daskpri.dashboard.snapshot`): plain dicts built from one run's table
and metrics, in the scheduler's process or through its RPC handlers.

Bokeh is imported only by :mod:`~daskpri.dashboard.components` and
:mod:`~daskpri.dashboard.page`, so that importing this package (or the
snapshot module) costs nothing where nothing is served.
"""

from __future__ import annotations
