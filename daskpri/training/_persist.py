"""The trainer's checkpoints and results: save, resume, ``history_``, ``table_``.

A mixin of :class:`~daskpri.training.trainer.Trainer`, on
:class:`~daskpri.training._step.StepMixin` (each step of the run), whose
``_flush`` sends the fresh priorities and records to the table before they are
saved or read. The work behind these methods is in
:mod:`~daskpri.training._resume` (the checkpoint written and read) and
:mod:`~daskpri.training._results` (the xarray objects returned).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, cast

import xarray as xr
from distributed import Client
from torch import nn

from daskpri.training import checkpoint
from daskpri.training._interrupts import dropped_by_interrupts
from daskpri.training._results import history_attrs, priority_table
from daskpri.training._resume import checkpoint_state, resume_trainer
from daskpri.training._step import StepMixin
from daskpri.training.early_stopping import Watch

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer


class PersistMixin(StepMixin):
    """Checkpoints and results, for :class:`~daskpri.training.trainer.Trainer`.

    The helpers in ``_resume`` and ``_results`` take the ``Trainer`` this is a
    base of; ``cast`` tells mypy so.
    """

    # set by Trainer.__init__
    _fit_thread: int | None  # the thread running a fit, if one does
    _checkpointed: int  # the step last written to checkpoint_path
    _watched: Watch | None  # the last fit's early stopping, where it had one

    # -- checkpoints ---------------------------------------------------------------------

    @dropped_by_interrupts
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write a checkpoint of the whole run to ``path``, atomically.

        It holds the model, the optimizer, the priority table with the
        selection's random state and the strategy's state, the step count and
        the history: :meth:`resume` continues the run exactly where it was.

        Parameters
        ----------
        path : str or os.PathLike
            The file to write; its directory is made where missing.

        Returns
        -------
        str
            ``path``, as a string.

        Raises
        ------
        RuntimeError
            Before the first :meth:`fit`, or while a fit runs in another
            thread (:meth:`fit_in_background`).
        OSError
            If the file cannot be written (a full disk): ``could not write
            the checkpoint 'PATH': No space left on device``, in one line.
            The file at ``path``, if any, is left as it was. A fit that
            checkpoints as it runs raises it, its history kept in
            :attr:`history_`.

        Examples
        --------
        >>> trainer.save("run.ckpt")  # doctest: +SKIP
        >>> trainer = daskpri.Trainer.resume("run.ckpt", client=client)  # doctest: +SKIP
        """
        if self._fit_elsewhere():
            raise RuntimeError(
                "save() while a fit runs in another thread (fit_in_background) could "
                "checkpoint a step half-applied; stop() it and wait for its future first, "
                "or pass checkpoint_path= and checkpoint_every= to checkpoint as it runs"
            )
        if self._table is None or self._opt is None:
            raise RuntimeError(self._no_run("nothing to save"))
        self._drop_prefetched()
        self._flush()
        return checkpoint.write(checkpoint_state(cast("Trainer", self)), path)

    def _no_run(self, what: str) -> str:
        """Why there is no run in the cluster: no fit yet, or closed after one."""
        if self.step_ == 0:
            return f"{what} yet: call fit first"
        return (f"{what}: close() released the run's table at step {self.step_}; save "
                "before closing, or pass checkpoint_path= to checkpoint as it runs")

    @classmethod
    @dropped_by_interrupts
    def resume(
        cls,
        path: str | os.PathLike[str],
        model: nn.Module | None = None,
        client: Client | None = None,
        **overrides: Any,
    ) -> Trainer:
        """A trainer that continues the run checkpointed at ``path``.

        The file is read weights-only. Call :meth:`fit` with the same data to
        go on: the step count, history, table and selections continue. The
        checkpoint keeps the data's fingerprint (dtypes, shapes, a few
        samples' values): other data of the same sample count is refused
        there, unless ``daskpri.trainer.resume-other-data`` is true.

        Parameters
        ----------
        path : str or os.PathLike
            A checkpoint written by :meth:`save` or by ``checkpoint_path=``.
        model : torch.nn.Module, optional
            A module of the run's architecture (its weights are replaced); it
            may be left out for the built-in models.
        client : distributed.Client, optional
            The cluster to go on in, as for the constructor.
        **overrides
            Where and how the run goes on, which may change: ``n_workers``,
            ``resources``, ``device``, ``transport``, ``eval_every``,
            ``on_nonfinite``, ``security``, ``checkpoint_path`` and
            ``checkpoint_every``, and ``schedule_steps``, to go on
            past the end of a decaying schedule. What the run computes
            otherwise comes from the checkpoint: its strategy and options,
            seed, batch size, optimizer, learning rate and its schedule,
            local steps, partitions and staleness model. A run that wrote
            checkpoints as it ran goes on writing them, every
            ``checkpoint_every`` steps, to ``path`` unless ``checkpoint_path``
            names another file: never to the path stored in the checkpoint.
            ``path``'s directory should then take a new file (refused here,
            saying so, where it does not: a read-only file system);
            ``checkpoint_path=None`` resumes without checkpoints, to
            evaluate or predict.

        Returns
        -------
        Trainer
            A new trainer at the checkpoint's step, with its history; its
            first :meth:`fit` restores the optimizer and the table in the
            cluster.

        Raises
        ------
        ValueError
            If ``overrides`` names anything else, or the file is not a
            checkpoint of this architecture, or one of its fields is damaged
            (weights, optimizer state, table or options that the run cannot
            go on from): refused here, before any cluster is used, in a
            line naming the field.

        Examples
        --------
        >>> trainer = daskpri.Trainer.resume("run.ckpt", client=client,  # doctest: +SKIP
        ...                                  checkpoint_every=50)
        >>> history = trainer.fit(train, eval_data=test, max_steps=2000)  # doctest: +SKIP
        """
        return resume_trainer(cast("type[Trainer]", cls), path, model, client, overrides)

    # -- results ------------------------------------------------------------------------

    @property
    def history_(self) -> xr.Dataset:
        """The metrics of every step so far, as an ``xarray.Dataset``.

        Built anew at each access (see the class's ``Attributes``); its
        ``attrs`` hold the run's settings. A fit that raised (a checkpoint
        the disk could not take, a lost scheduler) leaves in it the steps it
        took: write it with :func:`daskpri.data.to_store` to keep them.

        Examples
        --------
        >>> import daskpri
        >>> from daskpri.models import MLP
        >>> trainer = daskpri.Trainer(MLP((40,), 10), strategy="uniform")
        >>> trainer.history_.sizes["step"], trainer.history_.attrs["strategy"]
        (0, 'uniform')
        >>> trainer.fit(train, eval_data=test, max_steps=500)  # doctest: +SKIP
        >>> trainer.history_.loss.plot()  # doctest: +SKIP
        """
        return self._recorder.to_dataset(history_attrs(cast("Trainer", self)))

    @property
    def best_step_(self) -> int | None:
        """The step of the best evaluation of the last fit with ``early_stopping`` (else ``None``).

        Its ``monitor`` figure is :attr:`best_score_`; with ``restore_best``
        the model holds that step's weights once the fit has ended. ``None``
        before such a fit, after a fit without ``early_stopping``, or where
        no evaluation's figure was finite.

        Examples
        --------
        >>> import daskpri
        >>> from daskpri.models import MLP
        >>> daskpri.Trainer(MLP((40,), 10), strategy="uniform").best_step_ is None
        True
        >>> trainer.fit(train, eval_data=test, max_steps=5000, early_stopping=5)  # doctest: +SKIP
        >>> trainer.best_step_, trainer.best_score_, trainer.stopped_step_  # doctest: +SKIP
        (1199, 0.6795, 1449)
        """
        watch = self._watched
        return None if watch is None else watch.best_step

    @property
    def best_score_(self) -> float | None:
        """The ``monitor`` figure of :attr:`best_step_`'s evaluation (``None``: see there)."""
        watch = self._watched
        return None if watch is None else watch.best_score

    @property
    def stopped_step_(self) -> int | None:
        """The step at which the last fit's ``early_stopping`` patience ran out and ended it.

        ``None`` where that fit had no ``early_stopping``, or something else
        ended it (its budget, ``target_accuracy``, :meth:`stop`).
        """
        watch = self._watched
        return None if watch is None else watch.stopped_step

    @property
    def checkpointed_step_(self) -> int | None:
        """The step of the checkpoint last written to ``checkpoint_path`` (``None``: none yet).

        A fit writes one every ``checkpoint_every`` steps and where it ends,
        whatever ends it (its budget, :meth:`stop`); one stopped by an
        exception keeps the last written before it.

        Examples
        --------
        >>> import daskpri
        >>> from daskpri.models import MLP
        >>> daskpri.Trainer(MLP((40,), 10), strategy="uniform").checkpointed_step_ is None
        True
        >>> trainer = daskpri.Trainer(model, checkpoint_path="run.ckpt",  # doctest: +SKIP
        ...                           checkpoint_every=100)
        >>> _ = trainer.fit(train, max_steps=250)  # doctest: +SKIP
        >>> trainer.checkpointed_step_  # doctest: +SKIP
        250
        """
        return None if self._checkpointed < 0 else self._checkpointed

    def _fit_elsewhere(self) -> bool:
        """A fit runs in another thread (:meth:`fit_in_background`)."""
        return self._fit_thread not in (None, threading.get_ident())

    @property
    @dropped_by_interrupts
    def table_(self) -> xr.DataArray:
        """The current priorities along ``sample`` (fetched from the cluster).

        During a background fit, the table as the fit last sent it (it sends
        with every step): only the fit's own thread sends what it holds.

        Raises
        ------
        RuntimeError
            Before the first :meth:`fit` or after :meth:`close`, or once a
            client given to the trainer is closed.

        Examples
        --------
        >>> _ = trainer.fit(train, max_steps=500)  # doctest: +SKIP
        >>> trainer.table_.plot.hist(bins=50)  # the priority distribution  # doctest: +SKIP
        """
        if self._data_key is None:
            raise RuntimeError(self._no_run("no table_"))
        _ = self.client  # raises if it was closed
        if not self._fit_elsewhere():
            self._flush()
        return priority_table(cast("Trainer", self))
