"""A trainer's fit in a thread, its stop, and its dashboard.

A mixin of :class:`~daskpri.training.trainer.Trainer`, on
:class:`~daskpri.training._persist.PersistMixin`:
:meth:`~BackgroundMixin.fit_in_background` runs :meth:`Trainer.fit` in a
thread of its own, :meth:`~BackgroundMixin.stop` ends a fit (that one, or the
main thread's) after its step in flight, and :meth:`~BackgroundMixin.dashboard`
shows the cluster's live ``/daskpri`` page meanwhile. The fit itself, its
cluster and its close are the trainer's (:mod:`~daskpri.training.trainer`).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
from typing import TYPE_CHECKING, Any, cast

import xarray as xr

from daskpri._warnings import caller, warnings_from
from daskpri.training._fit import FIT_RUNNING, FitRequest, check_fit
from daskpri.training._interrupts import dropped_by_interrupts
from daskpri.training._persist import PersistMixin

if TYPE_CHECKING:
    from daskpri.training.early_stopping import EarlyStopping
    from daskpri.training.trainer import Trainer


class BackgroundMixin(PersistMixin):
    """A fit in a thread, its stop, the dashboard: for :class:`~daskpri.training.trainer.Trainer`.

    ``check_fit`` takes the ``Trainer`` this is a base of; ``cast`` tells mypy so.
    """

    # set by Trainer.__init__
    _fitting: threading.Lock  # held from a fit's call to its end: one at a time
    _background: concurrent.futures.Future[xr.Dataset] | None

    if TYPE_CHECKING:

        def fit(
            self, data: xr.Dataset | str, eval_data: xr.Dataset | str | None = None, *,
            max_steps: int | None = None, max_time: float | None = None,
            target_accuracy: float | None = None, progress: bool = True,
            eval_chunked: bool = False, early_stopping: EarlyStopping | int | None = None,
            callbacks: Any = None,
        ) -> xr.Dataset: ...

        def _fit_holding(self, request: FitRequest) -> xr.Dataset: ...

    def stop(self) -> None:
        """End the running :meth:`fit` after the step (or round) in flight.

        That fit evaluates, keeps its history and returns it as if its
        budget were spent; the trainer can fit again afterwards. Safe to call
        from any thread or a signal handler, for example while
        :meth:`fit_in_background` runs. Called when no fit runs, it ends the
        next one before its first step (a stop that lands as a fit ends on
        its own may so end the next one).

        Examples
        --------
        >>> future = trainer.fit_in_background(train, max_time=600)  # doctest: +SKIP
        >>> trainer.stop()  # doctest: +SKIP
        >>> history = future.result()  # the steps made so far  # doctest: +SKIP
        """
        self._stop_requested = True

    @dropped_by_interrupts
    def fit_in_background(
        self, data: xr.Dataset | str, eval_data: xr.Dataset | str | None = None, **kwargs: Any
    ) -> concurrent.futures.Future[xr.Dataset]:
        """Run :meth:`fit` in a thread; the future's result is the history.

        The notebook (or script) stays usable while the run goes on; watch it
        with :meth:`dashboard`. One fit at a time: a second call while one
        runs raises ``RuntimeError``.

        Parameters
        ----------
        data, eval_data
            As for :meth:`fit`.
        **kwargs
            The keyword arguments of :meth:`fit` (``max_steps``,
            ``max_time``, ``target_accuracy``, ``progress``,
            ``eval_chunked``, ``early_stopping``, ``callbacks``, called in
            the fit's thread); ``progress`` is ``False`` unless given.

        Returns
        -------
        concurrent.futures.Future of xarray.Dataset
            Its result is the history :meth:`fit` returns; it raises what
            the fit raised.

        Raises
        ------
        TypeError, ValueError
            If ``kwargs`` are not arguments of :meth:`fit`, or an argument's
            value is one :meth:`fit` refuses before any work in the cluster
            (``max_steps=-1``, ``data`` neither a Dataset nor a path,
            ``eval_data`` of another per-sample shape, ...): raised here, not
            in the thread. What fit finds later (the model against the data,
            the cluster's workers) the future raises.
        RuntimeError
            If a fit of this trainer is already running.

        Examples
        --------
        >>> future = trainer.fit_in_background(train, eval_data=test, max_time=60)  # doctest: +SKIP
        >>> trainer.dashboard()  # doctest: +SKIP
        >>> history = future.result()  # doctest: +SKIP
        """
        kwargs.setdefault("progress", False)
        # fit's arguments, bound here as fit would take them, with its defaults
        bound = inspect.signature(self.fit).bind(data, eval_data, **kwargs)
        bound.apply_defaults()
        if not self._fitting.acquire(blocking=False):  # released by the fit's thread
            raise RuntimeError(FIT_RUNNING)
        try:  # their values checked here too, and the data opened
            request = check_fit(cast("Trainer", self), *bound.args, **bound.kwargs)
        except BaseException:
            self._fitting.release()
            raise

        origin = caller()  # the warnings of the fit's thread point at this call's line

        def run() -> xr.Dataset:
            try:
                with warnings_from(origin):
                    return self._fit_holding(request)
            finally:
                self._fitting.release()

        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="daskpri-fit")
        try:
            self._background = executor.submit(run)
        except BaseException:
            self._fitting.release()
            raise
        executor.shutdown(wait=False)
        return self._background

    @dropped_by_interrupts
    def dashboard(self, height: int = 900) -> Any:
        """The live ``/daskpri`` page of this trainer's cluster.

        In Jupyter, an inline frame of the page (served by the scheduler, so
        the browser never talks to the driver); elsewhere, its address.

        Parameters
        ----------
        height : int, default 900
            Height of the frame in pixels.

        Returns
        -------
        IPython.display.IFrame or str
            The frame in a Jupyter kernel, else the page's address (see
            :func:`daskpri.dashboard.notebook.show`).

        Examples
        --------
        >>> future = trainer.fit_in_background(train, max_steps=2000)  # doctest: +SKIP
        >>> trainer.dashboard(height=600)  # doctest: +SKIP
        """
        from daskpri.dashboard.notebook import show

        return show(self.client, height=height)
