"""``selective-backprop``: backpropagate the high-loss part of a larger batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from daskpri.strategies._checks import (
    check_bool,
    check_fraction,
    check_int,
    check_number,
    check_positive_int,
)
from daskpri.strategies._selective import (
    CDF_REFERENCES,
    keep_by_cdf,
    keep_top,
    top_rows,
)
from daskpri.strategies._selective_steps import SelectiveSteps
from daskpri.strategies.base import (
    Batch,
    Computed,
    Strategy,
    check_score_dtype,
    score_dtype_of,
)

if TYPE_CHECKING:  # torch is the workers' (compute's): the scheduler selects without it
    import torch

    from daskpri.replicas.replica import Replica

#: what a step ranks its candidates by, and the table keeps (``score``)
SCORES = ("loss", "entropy")



def scale_grad(replica: Replica, computed: Computed, scale: float) -> None:
    """Multiply a step's gradient by ``scale``, where the step left it.

    In ``computed.grad`` (a step whose gradient goes to the driver), or in
    the module's ``.grad`` (local steps: the replica's ``keep_grads`` mode).

    Parameters
    ----------
    replica : Replica
        The worker's copy of the model; where ``computed.grad`` is None, the
        ``.grad`` of its parameters are scaled in place.
    computed : Computed
        The step's result; its ``grad``, where it has one, is scaled in
        place.
    scale : float
        The factor (the strategy's ``grad_scale``).

    Examples
    --------
    >>> import torch
    >>> from daskpri.replicas.replica import Replica
    >>> replica = Replica(torch.nn.Linear(4, 2), "cpu")
    >>> x, y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 1])
    >>> grad, _ = replica.grad_and_logits(x, y)
    >>> c = Computed(grad=grad.clone(), n_grad=5, rows=None, priorities=None,
    ...              loss_sum=None, n_loss=5, correct=None)
    >>> scale_grad(replica, c, 0.5)
    >>> torch.allclose(c.grad, 0.5 * grad)
    True
    """
    if computed.grad is not None:
        computed.grad.mul_(scale)
        return
    for p in replica.params:
        if p.grad is not None:
            p.grad.mul_(scale)


class SelectiveBackprop(SelectiveSteps, Strategy):
    """Forward a larger candidate batch, backpropagate its high-loss samples.

    Each worker draws ``batch_size / fraction`` candidates in a shuffled pass
    over its data, computes their losses (forward only; they all become
    priorities) and backpropagates either the top ``fraction`` by loss
    (``beta=None``), or each candidate with probability ``CDF(L)^beta``, the
    CDF taken over the table's losses (Jiang et al. 2019). Their CDF is over
    a rolling history of the most recent losses computed (``cdf="recent"``);
    by default it is over a sample of 1,024 of the table's last losses, one
    a sample, some an epoch old: where the losses fall fast it keeps fewer
    candidates than theirs would (0.879 of a batch against 0.955 at
    ``beta=1`` in a synthetic check, losses falling with a 100-step time
    constant), and the same where they are steady.

    With ``refresh=k``, only one epoch in ``k`` of each worker's candidate
    walk scores its candidates with a fresh forward pass; in the others the
    candidates are ranked by the losses the table holds for them (their last
    forward pass; under a staleness model other than ``keep``, the table's
    estimate of it now, as the CDF's reference is), and only the kept ones
    are forwarded and backpropagated, which makes those steps as cheap as a
    uniform step (the paper's Stale-SB). Unseen samples rank first. With
    ``beta``, a stale step draws candidates until ``batch_size`` are kept,
    as Jiang et al. fill theirs.

    With ``warmup=w``, the walk's first ``w`` epochs are plain mini-batch
    SGD: ``batch_size`` samples a step, in walk order, with no scoring pass;
    their losses, from the training forward pass, fill the table for the
    stale epochs that follow. ``w`` may be a fraction: ``0.5`` trains the
    first half of the first epoch plainly and selects from its middle on.
    The selective epochs count from the one the warmup ends in: with
    ``refresh=k`` that one scores afresh (from where the warmup ends).

    With ``anneal_step=n``, every step from the trainer's step ``n`` on is
    plain mini-batch SGD again, in walk order and unscored (InfoBatch's
    annealing, Qin et al. 2024): a run whose length is known ends on the
    full data, as uniform does, rather than on the top losses alone.

    The next round may be selected while the workers compute this one
    (``selects_ahead``): within an epoch its candidates are not the round in
    flight's, and where they are (a new epoch's walk), the table declines
    and the round is selected once the priorities arrive
    (``wait_for_inflight=False``: it reads them as the table holds them, a
    round old, and the workers never wait). With ``beta``, the CDF's
    reference is then drawn from the table before the round in flight's
    losses reach it.

    The defaults (``fraction=0.25, warmup=1``, every epoch after the
    warmup scored afresh) are the setting that took the fewest steps to 99%
    of uniform's best test accuracy on each of the four models ``daskpri
    bench`` measures, 2 workers as it runs them (``benchmarks/
    steps_to_target.py``, 10 seeds, 3 on the MNIST-1D MLP; twenty-fifth
    session). Median steps, the selective arms at the learning rate shown,
    uniform at its best:

    ========================  ========  ==========================  ==========
    model (lr)                uniform   paper's ``fraction=0.5``     defaults
    ========================  ========  ==========================  ==========
    MNIST-1D MLP (0.25)       11,296    5,168                       3,456
    ``mnist5k`` MLP (0.3)     224       152                         136
    ``mnist5k`` CNN (0.075)   160       112                         80
    MNIST-1D CNN (0.15)       544       440                         288
    ========================  ========  ==========================  ==========

    A fresh step forwards ``1/fraction`` times the batch, so where a
    forward pass costs a good part of a training step (a CNN on a CPU: 256
    candidates of the MNIST-1D CNN took 0.87 of a training step of 64 in
    ``benchmarks/score_chunks.py --rows 256``) the steps saved are paid
    back in scoring; there ``refresh=8`` (with ``fraction=0.33``) and
    ``score_dtype="bfloat16"`` save the time (the README's "Which to use").

    Parameters
    ----------
    fraction : float
        Fraction of the candidates backpropagated, in (0, 1]: a step
        forwards ``batch_size / fraction`` candidates. Jiang et al.'s 0.5
        took 1.1x-1.5x the steps of the default 0.25 (above).
    beta : float, optional
        Selectivity of the probabilistic rule; ``None`` keeps the top fraction.
    batch_size : int, optional
        Samples backpropagated per worker per step (with ``beta``: in
        expectation where scored afresh, and never more: a fresh step whose
        rule keeps more backpropagates the highest losses among them;
        exactly in stale steps); ``None`` takes the trainer's.
    refresh : int, optional
        Score afresh in epochs ``w, w + k, w + 2k, ...`` of the candidate
        walk (``w``: ``warmup``, rounded down) and by the table's losses in
        the others; ``None`` (or 1) scores every epoch after the warmup.
    warmup : float
        Epochs of the walk trained as plain mini-batch SGD before selection
        begins (0: none; default 1), a whole number or not: selection begins at the
        step whose draw starts past ``warmup`` passes of the worker's
        samples. On the MNIST-1D CNN (``fraction=0.33, refresh=8``, lr
        0.15, 10 seeds, 8,000 samples a worker) the steps to 99% of
        uniform's best accuracy were 616 with no warmup, 384, 400, 336 and
        392 with 0.5, 0.75, 1 and 1.5 epochs (uniform: 544), and on the
        ``mnist5k`` CNN (``score_dtype="bfloat16"``, lr 0.075) 144, 96 and
        120 with 0.5, 1 and 1.5 (uniform: 160; twenty-second session): the
        ranking needs a model that has seen the data once.
    anneal_step : int, optional
        The trainer's step (counted from 0, over all rounds) from which
        every step is plain mini-batch SGD; ``None`` selects to the end.
        Set it where the last part of a planned run should train on the
        full data: InfoBatch anneals at 87.5% of its epochs. On the
        ``mnist5k`` CNN (``fraction=0.33, refresh=8, warmup=1,
        score_dtype="bfloat16"``, lr 0.1, 10 seeds) ``anneal_step=400``
        left the mean test accuracy at step 800 where it was (0.9615
        against 0.9617; uniform 0.9624): the selection levels off by step
        192, and plain steps at the same rate did not lift it there
        (``benchmarks/accuracy_by_step.py``; twenty-third session).
    stale_beta : float, optional
        Selectivity of the probabilistic rule in the stale steps (``refresh``),
        which rank by the table's losses and forward only what they keep, so
        that a higher one costs no scoring pass; ``None`` takes ``beta``.
        Needs ``beta`` and ``refresh``.
    score_dtype : {"float32", "bfloat16", "float16"}
        Precision of the scoring forward pass (``torch.autocast``); the
        selected samples' training step stays in float32. Where the
        hardware has the arithmetic (AVX512-BF16 or AMX on a CPU, a GPU)
        and the layers are large enough, a lower one scores faster: the
        ``mnist5k`` CNN's pass 1.58x-1.67x on an AVX512-BF16 CPU, MNIST-1D's
        small models not at all (``benchmarks/score_dtype.py``). Losses
        differ by a few percent; ranks barely.
    prefilter : float
        Share of a fresh step's candidates that its scoring pass forwards,
        in (0, 1]: the step draws ``1/prefilter`` times as many candidates
        from the walk and scores only the top ``prefilter`` of them by the
        table's losses (unseen samples first), so the samples that the
        table already knows to be easy are passed over without a forward
        pass. 1 (the default) scores every candidate. Stale steps rank by
        the table anyway and are not affected. With ``beta``, the scored
        candidates rank higher against the CDF than a plain draw's, so the
        rule keeps more than ``batch_size`` of them in expectation; a step
        backpropagates ``batch_size`` at most. A smaller share also makes
        the fresh epochs shorter (each step spends more of the walk), so
        fewer scoring passes come between the stale epochs. On the MNIST-1D
        CNN (``beta=1, refresh=3, warmup=1, stale_beta=5``, 10 seeds, lr
        0.1), ``prefilter=0.75`` reached the target in 320 steps against
        360 in two runs (fifteenth session), and ``prefilter=0.5`` in 360
        steps against uniform's 672, 1.51x and, capped at the batch, 1.55x
        uniform's time against 1.48x for 0.75 (sixteenth and seventeenth
        sessions); counted in steps alone (eval every 8 steps), 0.5 took
        328, 0.75 352, 0.33 384. On the ``mnist5k`` MLP (``fraction=0.25,
        refresh=4``) ``prefilter=0.5`` cost steps (128 against 96). Not yet
        a default.
    wait_for_inflight : bool
        Where a round selected ahead (while the workers compute the round
        before) would read the table's loss of a sample of that round in
        flight, select it once the round's losses arrive, while the workers
        wait (True, the default: a round reads the losses it would read
        selected after), or read the loss the table holds, from the
        sample's scoring before that round, and never wait (False). A run
        selects the same samples each time either way, but with False one
        without prefetch (``daskpri.trainer.prefetch``) selects after each
        round and so reads other losses than one with it. Where a pass of
        the walk draws its first rounds from a plain shuffle (the default;
        see ``recent_last``), they hold samples of the round in flight: on
        the MNIST-1D CNN
        (``beta=1, refresh=3, warmup=1, stale_beta=5, prefilter=0.5``) the
        table declined 68 of 74 rounds, and selecting
        them while the workers wait takes about 5% of the step time; with
        False the steps to 99% of uniform's best accuracy stay 352 (median
        of 40 seeds; mean 362 against 353), and five 10-seed ``daskpri
        bench`` runs reached it 1.57x-1.65x sooner than uniform (1.61x their
        median) against 1.52x-1.56x waiting. On 2 cores the selection made ahead takes its
        CPU from the workers (the scheduler shares them); with a core of its
        own it is free. Where a worker's pass of the walk is shorter than a
        round, a loss a round old predates the sample's last pass, and
        ranking by it costs steps: on the ``mnist5k`` MLP (``fraction=0.25,
        refresh=4``, passes of about 10 steps, rounds of 16) 0.64x uniform's
        time to the target against 1.31x waiting.
    recent_last : bool
        Where the selection reads the table (``refresh``, ``beta``,
        ``prefilter``): a new pass of a worker's walk draws last the
        samples that the last two rounds drew from the pass before
        (:func:`daskpri.strategies.base.mark_round`), so that the rounds
        after it draw none of the round in flight's and are selected while
        the workers compute it, instead of after it (``wait_for_inflight``)
        or from losses a round old (``wait_for_inflight=False``). Every
        sample is still drawn once a pass. False (the default): each pass
        is a plain shuffle, whose first rounds draw some of the round in
        flight's samples as good as always. No effect where the selection
        reads no table (the strategy's defaults). On the MNIST-1D CNN
        (``fraction=0.33, refresh=4, warmup=1``, 10 seeds, 2 workers on 2
        cores) it raised the rounds selected ahead from 36% to 99% and cut
        the share of the step time the workers waited for the selection
        from 3.4% to 0.5%, and it costs no steps (40 seeds to 99% of
        uniform's best accuracy: mean 344.4 against 344.8, paired
        difference -0.4 +- 10.8; ``benchmarks/steps_to_target.py``); but
        the time to that target did not fall (1.41x-1.44x uniform's in
        two runs against 1.50x-1.77x with plain shuffles, where the
        bench's seeds 0-9 happened to take 8% more steps with it): on 2
        cores the selection made ahead takes its CPU from the workers
        (the scheduler shares them), so it stays off by default. On a
        cluster whose scheduler has cores of its own the wait it removes
        is time saved (not measured here; twenty-seventh session).
    grad_scale : float
        Multiplies the gradient of every selected step (scored afresh or
        ranked by the table), not of the plain steps (``warmup``,
        ``anneal_step``); 1 (the default) leaves them as they are. With SGD
        it sets the selected steps' learning rate to ``grad_scale`` times the
        trainer's, so that the warmup runs at a plain mini-batch's rate and
        the selection at its own: the top losses' gradients are 1.2x-3x the
        norm of a uniform batch's (thirty-first session), and one rate for
        both is too low for the one or too high for the other. On the
        MNIST-1D CNN (``fraction=0.33, refresh=8, warmup=1``, seeds 10-19,
        ``benchmarks/steps_to_target.py``) lr 0.2 with ``grad_scale=0.5``
        reached 99% of uniform's best accuracy in 296 steps against 336 at
        0.1 unscaled (uniform: 528 at its best, 0.15; 520 and 536 with 0.2
        for its first 128 steps); on the ``mnist5k`` CNN, whose rate is
        bounded by the selection's, it did not help (thirty-second
        session). Adam and other optimizers that normalise the gradient's
        scale undo most of it.
    score : {"loss", "entropy"}
        What a step ranks its candidates by, and the table keeps for them:
        the per-sample loss (the default, as Jiang et al.), or the entropy
        of the model's predicted distribution, ``-sum p log p`` (the
        uncertainty of active learning, which passes over samples the model
        gets confidently wrong). Both come from the same forward pass; the
        warmup's and stale steps' forward passes give the table the same
        score (:meth:`priority`), and ``beta``'s CDF is then over
        entropies. The history's ``loss`` stays the loss. Steps to 99% of
        uniform's best test accuracy (``benchmarks/steps_to_target.py``,
        ``fraction=0.33, refresh=8, warmup=1``, thirty-fifth session):
        on the ``mnist5k`` CNN (lr 0.1) 96 and 104 on seeds 10-19 and
        20-29 against 104 and 104 for the loss (uniform 152 and 160; 4.8
        steps fewer per seed on average, within the seeds' spread); on
        the MNIST-1D CNN (lr 0.2, ``grad_scale=0.5``, seeds 10-19) 320
        against 296. Not the default: it saves no steps over the loss here.

    cdf : {"table", "recent"}
        What ``beta``'s CDF is taken over: a sample of 1,024 of the losses
        the table holds, one a sample (``"table"``, the default), or the
        1,024 losses computed last, Jiang et al.'s rolling history
        (``"recent"``; with a staleness model other than ``keep``, as the
        table estimates them now). Needs ``beta``. On the MNIST-1D CNN (lr
        0.1, ``beta=1, warmup=1``, seeds 10-29, ``benchmarks/
        steps_to_target.py``, thirty-eighth session) ``"recent"`` took 400
        steps to 99% of uniform's best accuracy against 384 (a tie: 9.6 more
        a seed on average, standard error 12.7), and with ``refresh=3,
        stale_beta=5`` 424 against 352 (66 more, standard error 16), though
        its steps train as many samples (54.1 a worker-step against 54.8,
        seed 10, steps 160-400); there the losses computed last are mostly
        the stale steps' kept samples, not a draw of the data. Not the
        default.

    Examples
    --------
    >>> SelectiveBackprop(fraction=0.5).name
    'selective-backprop'
    """

    name = "selective-backprop"
    # stale steps read the priorities of their candidates only, which in an
    # epoch are not the round in flight's; the beta rule's CDF reference is a
    # sample of the table as a whole
    selects_ahead = True

    def __init__(
        self,
        fraction: float = 0.25,
        beta: float | None = None,
        batch_size: int | None = None,
        refresh: int | None = None,
        warmup: float = 1,
        stale_beta: float | None = None,
        score_dtype: str = "float32",
        prefilter: float = 1.0,
        wait_for_inflight: bool = True,
        anneal_step: int | None = None,
        recent_last: bool = False,
        grad_scale: float = 1.0,
        score: str = "loss",
        cdf: str = "table",
    ) -> None:
        self.fraction = check_fraction("fraction", fraction, low_open=True)
        self.beta = None if beta is None else check_number("beta", beta, 0.0, low_open=True)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.refresh = check_positive_int("refresh", refresh)
        warmup = check_number("warmup", warmup, 0.0)
        # a whole number stays an int, as it reads in the parameters and their repr
        self.warmup: float = int(warmup) if warmup.is_integer() else warmup
        self.stale_beta = (
            None if stale_beta is None
            else check_number("stale_beta", stale_beta, 0.0, low_open=True)
        )
        self.score_dtype = check_score_dtype(score_dtype)
        self.prefilter = check_fraction("prefilter", prefilter, low_open=True)
        self.wait_for_inflight = check_bool("wait_for_inflight", wait_for_inflight)
        self.recent_last = check_bool("recent_last", recent_last)
        self.grad_scale = check_number("grad_scale", grad_scale, 0.0, low_open=True)
        if score not in SCORES:
            raise ValueError(
                f"score should be one of {', '.join(map(repr, SCORES))}, but got score={score!r}"
            )
        self.score = score
        self.anneal_step = None if anneal_step is None else check_int("anneal_step", anneal_step, 0)
        if cdf not in CDF_REFERENCES:
            raise ValueError(
                f"cdf should be one of {', '.join(map(repr, CDF_REFERENCES))}, but got cdf={cdf!r}"
            )
        if cdf != "table" and self.beta is None:
            raise ValueError(
                f"cdf chooses what the probabilistic rule's CDF is over, so it needs beta, "
                f"but got cdf={cdf!r}, beta=None"
            )
        self.cdf = cdf
        if self.stale_beta is not None and (self.beta is None or (self.refresh or 1) == 1):
            raise ValueError(
                "stale_beta sets the probabilistic rule's selectivity in stale steps, so it "
                f"needs beta and a refresh of 2 or more, but got beta={beta!r}, "
                f"refresh={refresh!r}"
            )

    def priority(self, losses: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The losses, or with ``score="entropy"`` the predictions' entropies.

        Called on the worker for every row a step forwards: a fresh step's
        candidates, and the rows a plain or stale step trains, so that the
        table keeps the score the fresh steps rank by.

        Parameters
        ----------
        losses : torch.Tensor, shape (n,)
            The rows' cross-entropy losses.
        logits : torch.Tensor, shape (n, classes)
            The rows' logits.

        Returns
        -------
        torch.Tensor, shape (n,)
            ``losses`` themselves (``score="loss"``), or the entropy of each
            row's predicted distribution, ``-sum p log p`` with ``p`` the
            softmax of its logits (``score="entropy"``).

        Examples
        --------
        >>> import torch
        >>> losses, logits = torch.tensor([0.5, 2.0]), torch.tensor([[0.0, 0.0], [5.0, 0.0]])
        >>> SelectiveBackprop().priority(losses, logits)
        tensor([0.5000, 2.0000])
        >>> SelectiveBackprop(score="entropy").priority(losses, logits)  # log 2: a coin toss
        tensor([0.6931, 0.0402])
        """
        from daskpri.replicas.replica import sample_entropies  # (torch's: the workers')

        return sample_entropies(logits) if self.score == "entropy" else losses

    @property  # a property, not a parameter: get_params() gives __init__'s only
    def reads_table(self) -> bool:  # type: ignore[override]
        """Candidates come from the shuffled walk alone, unless ranked by the
        table's losses (``refresh``, ``prefilter``) or drawn against their
        distribution (``beta``).

        Examples
        --------
        >>> SelectiveBackprop().reads_table
        False
        >>> [SelectiveBackprop(**o).reads_table
        ...  for o in ({"refresh": 4}, {"prefilter": 0.5}, {"beta": 1.0})]
        [True, True, True]
        """
        return self.beta is not None or self.refresh is not None or self.prefilter < 1.0

    def compute(self, replica: Replica, batch: Batch) -> Computed:
        """Score the candidates, backpropagate the kept ones; or train a plain step.

        A step selected with ``extra["stale"]`` (warmup, annealed, or kept by
        the table's losses) trains its rows as :meth:`Strategy.compute` does,
        its gradient times ``grad_scale`` where it carries ``extra["scaled"]``.
        Otherwise a forward pass in :attr:`score_dtype` scores every
        candidate (:meth:`priority`), and the top ``fraction`` of them, or
        with ``beta`` those the probabilistic rule keeps against
        ``extra["reference"]`` (at most ``extra["batch_size"]``, the highest
        scores), are backpropagated, the gradient times ``grad_scale``.

        Parameters
        ----------
        replica : Replica
            The worker's copy of the model.
        batch : Batch
            The selected samples.

        Returns
        -------
        Computed
            The gradient sum of the rows backpropagated (``n_grad``), and
            every row's score as its priority; the loss is over every row.

        Examples
        --------
        >>> import torch
        >>> from daskpri.models import MLP
        >>> from daskpri.replicas.replica import Replica
        >>> from daskpri.strategies import Batch
        >>> replica = Replica(MLP((4,), 3, hidden=8), "cpu")
        >>> batch = Batch(x=torch.linspace(-1, 1, 32).reshape(8, 4),
        ...               y=torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), indices=np.arange(8),
        ...               n_train=8, weights=None, mean_grad=None, extra={}, seed=[0])
        >>> fresh = SelectiveBackprop(fraction=0.25).compute(replica, batch)
        >>> fresh.n_grad, fresh.n_loss, fresh.priorities.shape  # 8 scored, 2 backpropagated
        (2, 8, torch.Size([8]))
        >>> batch.extra = {"stale": np.ones(0, dtype=bool)}
        >>> SelectiveBackprop().compute(replica, batch).n_grad  # a plain step: all 8
        8
        """
        import torch  # (on the workers: the scheduler selects without it)

        if "stale" in batch.extra:
            c = super().compute(replica, batch)
            if "scaled" in batch.extra:
                scale_grad(replica, c, self.grad_scale)
            return c
        losses, logits = replica.losses(batch.x, batch.y, score_dtype_of(self.score_dtype))
        priorities = self.priority(losses, logits)
        if self.beta is None:
            # chosen where the losses are, and the step's numbers left as tensors that the
            # worker converts once a round: a small model's step is a fraction of a
            # millisecond, which a numpy round trip each step adds to
            sel = top_rows(priorities, self.fraction)
        else:
            scores = priorities.cpu().numpy().astype(np.float64)
            rows = keep_by_cdf(scores, batch.extra["reference"], self.beta, batch.rng)
            cap = int(batch.extra.get("batch_size", rows.size))
            if rows.size > cap:
                # the rule keeps more than the batch where the candidates rank high against
                # the CDF (prefilter): the batch's worth of the highest losses among them
                rows = rows[keep_top(scores[rows], cap, batch.rng)]
            sel = torch.as_tensor(rows, device=batch.x.device)
        if sel.numel():
            grad, _ = replica.grad_and_logits(batch.x[sel], batch.y[sel])
        else:
            grad = torch.zeros(replica.n_params, device=batch.x.device)
        c = Computed(
            grad=grad,
            n_grad=int(sel.numel()),
            rows=None,
            priorities=priorities,
            loss_sum=losses.double().sum(),
            n_loss=int(losses.numel()),
            correct=(logits.argmax(1) == batch.y).sum(),
        )
        if self.grad_scale != 1.0 and sel.numel():
            scale_grad(replica, c, self.grad_scale)
        return c
