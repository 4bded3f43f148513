"""A model replica: one copy of the user's module on a worker's device.

The replica computes what strategies ask for on a batch: per-sample losses
(forward only), the weighted gradient, and per-sample gradients through
:mod:`torch.func` (``vmap`` over ``grad``), all as flat vectors in the order of
``module.parameters()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from daskpri.replicas._numpy_tensors import TensorsAsNumpy

#: the largest layer output that a chunk of a CPU scoring pass should hold (:meth:`Replica.logits`)
SCORE_CHUNK_BYTES = 4 * 2**20


#: The training precisions (the Trainer's ``precision``): the dtype of the
#: forward and backward passes' ``torch.autocast``, None for none.
PRECISIONS: dict[str, torch.dtype | None] = {"float32": None, "bfloat16": torch.bfloat16}


def check_precision(dtype: torch.dtype | None, device: torch.device) -> torch.dtype | None:
    """The autocast dtype to train in on ``device`` (None: float32), or ``ValueError``.

    bfloat16 autocast runs on every CPU (natively where it has AVX512-BF16
    or AMX, else emulated, and slower than float32) and on CUDA GPUs of
    compute capability 8.0 or more (Ampere on): an older GPU would emulate
    it slowly or not at all.

    Examples
    --------
    >>> check_precision(torch.bfloat16, torch.device("cpu"))
    torch.bfloat16
    >>> check_precision(torch.float32, torch.device("cpu")) is None
    True
    >>> check_precision(torch.float16, torch.device("cpu"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: precision should be one of ['float32', 'bfloat16'], but got torch.float16 (...)
    """
    if dtype is None or dtype == torch.float32:
        return None
    if dtype != torch.bfloat16:
        raise ValueError(
            f"precision should be one of {list(PRECISIONS)}, but got {dtype} (float16 would "
            "need its loss scaled; bfloat16 has float32's range and needs none)"
        )
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            raise ValueError(
                f"precision='bfloat16' needs a GPU of compute capability 8.0 or more "
                f"(Ampere on), but {device} ({torch.cuda.get_device_name(device)}) has "
                f"{major}.{minor}: train in precision='float32'"
            )
    return dtype


@dataclass
class Weights(TensorsAsNumpy):
    """What the driver ships to the replicas each step (CPU tensors only).

    ``params`` is the flat parameter vector; ``buffers`` the module's buffers;
    ``mean_grad`` the running mean gradient for strategies that use one.
    """

    version: int
    params: torch.Tensor
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    mean_grad: torch.Tensor | None = None


def sample_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy losses, ``F.cross_entropy(..., reduction="none")``.

    On a CPU with few classes (under 32) and many rows (128 or more) as
    ``logsumexp - logit of the label``, which gives the same losses to a few
    ulps: there torch's ``log_softmax`` over a short last dimension is slow,
    3.4 ms against 0.8 ms for 32,768 rows of 10 classes on one thread (the
    losses of a round of 512 local steps), 28 us against 16 us for 256. Elsewhere
    (a GPU's fused kernel, many classes, few rows) ``F.cross_entropy`` itself.

    Examples
    --------
    >>> seeded = torch.Generator().manual_seed(0)
    >>> logits = torch.randn(300, 10, generator=seeded)
    >>> labels = torch.randint(0, 10, (300,), generator=seeded)
    >>> ours = sample_losses(logits, labels)
    >>> torch.allclose(ours, F.cross_entropy(logits, labels, reduction="none"), atol=1e-5)
    True
    """
    rows, classes = logits.shape
    if logits.device.type == "cpu" and classes < 32 and rows >= 128:
        return torch.logsumexp(logits, 1) - logits.gather(1, labels.unsqueeze(1)).squeeze(1)
    return F.cross_entropy(logits, labels, reduction="none")


def sample_entropies(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each row's predicted distribution, ``-sum softmax * log_softmax``.

    As ``logsumexp(z) - sum softmax(z) * z``, which needs no ``log_softmax``
    (slow over a short last dimension on a CPU; see :func:`sample_losses`).

    Examples
    --------
    >>> logits = torch.randn(300, 10, generator=torch.Generator().manual_seed(0))
    >>> logp = logits.log_softmax(1)
    >>> torch.allclose(sample_entropies(logits), -(logp.exp() * logp).sum(1), atol=1e-5)
    True
    >>> round(sample_entropies(torch.zeros(1, 4)).item(), 6)  # log 4: nothing told apart
    1.386294
    """
    lse = torch.logsumexp(logits, 1, keepdim=True)
    return (lse - ((logits - lse).exp() * logits).sum(1, keepdim=True)).squeeze(1)


def flat_params(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """The parameters as one flat vector (a copy), in their order.

    Unlike ``torch.nn.utils.parameters_to_vector`` it takes parameters of any
    layout, such as a channels-last convolution's (each is read in its
    logical order, as ``reshape`` reads it).

    Examples
    --------
    >>> w = torch.arange(24.0).reshape(2, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    >>> torch.equal(flat_params([w, torch.ones(2)]), torch.cat([torch.arange(24.0), torch.ones(2)]))
    True
    """
    return torch.cat([p.detach().reshape(-1) for p in params])


def flat_views(flat: torch.Tensor, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut into views shaped as ``params``, in their order.

    Examples
    --------
    >>> [tuple(v.shape) for v in flat_views(torch.arange(7.0), [torch.ones(2, 2), torch.ones(3)])]
    [(2, 2), (3,)]
    """
    params = list(params)
    chunks = flat.split([p.numel() for p in params])
    return [chunk.view_as(p) for chunk, p in zip(chunks, params, strict=True)]


def load_flat(params: Iterable[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the flat vector ``flat`` into ``params``, in their order, keeping their layout.

    The parameters keep their own storage (``vector_to_parameters`` makes
    them views of ``flat`` instead).
    """
    params = list(params)
    with torch.no_grad():
        for p, view in zip(params, flat_views(flat, params), strict=True):
            p.copy_(view)


class Replica:
    """Computations of one replica of ``module`` on ``device``.

    ``label_smoothing`` is the training loss's (``F.cross_entropy``'s): the
    gradients are those of the smoothed loss, while the losses returned
    (the strategies' scores, the history's training loss) stay the plain
    cross-entropy, so that they rank and compare alike whatever the
    smoothing.

    ``precision`` (``torch.bfloat16``) runs the training passes (the
    forward and backward of :meth:`weighted_grad`, :meth:`grad_and_logits`
    and :meth:`per_sample_grads`) under ``torch.autocast`` in it: the
    parameters, their gradients and the losses stay float32. ``None``:
    float32 throughout. The scoring passes (:meth:`logits`) take their own
    ``dtype``, the strategies' ``score_dtype``.

    Examples
    --------
    >>> import torch
    >>> replica = Replica(torch.nn.Linear(3, 2), "cpu")
    >>> x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    >>> g, losses, logits = replica.per_sample_grads(x, y)
    >>> tuple(g.shape)
    (4, 8)
    """

    def __init__(
        self, module: nn.Module, device: str | torch.device, label_smoothing: float = 0.0,
        precision: torch.dtype | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.label_smoothing = label_smoothing
        self.precision = check_precision(precision, self.device)
        self.module = module.to(self.device)
        self.module.train()
        self.version = -1
        self.params = list(self.module.parameters())
        self.has_buffers = any(True for _ in self.module.buffers())
        self.n_params = sum(p.numel() for p in self.params)
        #: leave :meth:`weighted_grad`'s gradient in the parameters' ``.grad``
        #: for an optimizer on this replica (local steps) instead of flattening it
        self.keep_grads = False
        #: the rows of the last gradient kept that way (it is their mean)
        self.kept_rows = 0
        #: rows per chunk of a scoring pass (:meth:`logits`) for each sample
        #: shape and precision measured so far; None: whole
        self.score_rows: dict[tuple[tuple[int, ...], torch.dtype | None], int | None] = {}

    def load(self, weights: Weights) -> None:
        """Copy ``weights`` into the module; the parameters unless loaded already.

        The buffers are copied every time: forward passes in training mode
        change them (batch norm's running statistics), so a step computed
        again after a failure starts from the driver's.
        """
        with torch.no_grad():
            if weights.version != self.version:
                # copied, not viewed (``vector_to_parameters``): in a cluster of
                # threads every replica would otherwise train the driver's one tensor
                load_flat(self.params, weights.params.to(self.device, non_blocking=True))
            if weights.buffers:
                named = dict(self.module.named_buffers())
                for name, value in weights.buffers.items():
                    named[name].copy_(value.to(self.device))
        self.version = weights.version

    def losses(
        self, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses and logits, forward only (``dtype``: see :meth:`logits`)."""
        logits = self.logits(x, dtype)
        return sample_losses(logits, y), logits

    def logits(self, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The module's output, forward only.

        ``dtype`` (``torch.bfloat16`` or ``torch.float16``) runs the module
        under ``torch.autocast`` in that precision; the logits come back as
        float32. ``None`` or ``torch.float32``: in full precision.

        On a CPU the rows go through the module in chunks of
        :attr:`score_rows`, so that no layer's output over a chunk is larger
        than `SCORE_CHUNK_BYTES` (or one row's): the first call for a sample
        shape and precision runs whole and measures the largest output per
        row. Large activations cost a CPU more than their arithmetic: glibc
        returns freed buffers of tens of MiB to the system, and the next
        ones are faulted in again page by page (with its mmap and trim
        thresholds raised, 13 ms whole where a step took 13 ms). A scoring pass of 192
        ``mnist5k`` images through the built-in CNN took 26 ms whole and
        9.2 ms in chunks of 41 rows, in bfloat16 7.9 ms and 7.1 ms in chunks
        of 83, where a training step of 64 took 12 ms
        (``benchmarks/score_chunks.py``, one thread); MNIST-1D's models, with
        small activations, are not chunked. A GPU and a module with buffers
        (batch norm's statistics in training mode depend on the batch) take
        the rows whole.
        """
        with torch.no_grad():
            key = (tuple(x.shape[1:]), dtype)
            if key not in self.score_rows and x.shape[0]:
                out, self.score_rows[key] = self._measured_forward(x, dtype)
                return out
            rows = self.score_rows.get(key)
            if rows is None or x.shape[0] <= rows:
                return self._forward(x, dtype)
            return torch.cat([self._forward(part, dtype) for part in x.split(rows)])

    def _forward(self, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        if dtype is None or dtype == torch.float32:
            return self.module(x)
        with torch.autocast(self.device.type, dtype=dtype):
            out = self.module(x)
        return out.float()

    def _measured_forward(
        self, x: torch.Tensor, dtype: torch.dtype | None
    ) -> tuple[torch.Tensor, int | None]:
        """:meth:`_forward` of ``x`` whole, and the rows a chunk of a later pass takes."""
        if self.device.type != "cpu" or self.has_buffers:
            return self._forward(x, dtype), None
        largest = [0]

        def measure(module: nn.Module, inputs: object, output: object) -> None:
            if isinstance(output, torch.Tensor):
                largest[0] = max(largest[0], output.numel() * output.element_size())

        hooks = [m.register_forward_hook(measure) for m in self.module.modules()]
        try:
            out = self._forward(x, dtype)
        finally:
            for hook in hooks:
                hook.remove()
        per_row = largest[0] / x.shape[0]
        return out, max(1, int(SCORE_CHUNK_BYTES // per_row)) if per_row else None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The training passes' ``torch.autocast`` in :attr:`precision` (none in float32)."""
        if self.precision is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.precision)

    def weighted_grad(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``sum_i w_i * grad L_i`` as a flat vector, the losses and logits.

        With :attr:`keep_grads` the mean over the rows (the sum divided by
        ``len(x)``, ready for an optimizer step) stays in the parameters'
        ``.grad``, and ``None`` takes the flat vector's place.
        """
        grad, losses, logits = self._backward(x, y, w, need_losses=True)
        assert losses is not None
        return grad, losses, logits

    def grad_and_logits(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """:meth:`weighted_grad` without the per-sample losses: the gradient and logits.

        Without weights the losses are not computed at all (a caller that
        needs them takes them from the detached logits, perhaps later and
        for many steps at once).
        """
        grad, _, logits = self._backward(x, y, w, need_losses=False)
        return grad, logits

    def _backward(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, need_losses: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        for p in self.params:
            p.grad = None
        with self._autocast():
            logits = self.module(x)
        logits = logits.float()  # (the loss in float32, as under autocast on a GPU)
        n = x.shape[0]
        losses: torch.Tensor | None = None
        smoothing = self.label_smoothing
        if w is None and n:
            # The fused reduction backpropagates about 40 us a step faster than
            # one over per-sample losses; those are computed again, graph-free.
            F.cross_entropy(logits, y, reduction="mean" if self.keep_grads else "sum",
                            label_smoothing=smoothing).backward()
            logits = logits.detach()
            if need_losses:
                losses = sample_losses(logits, y)
        else:
            losses = F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing)
            total = losses.sum() if w is None else (losses * w).sum()
            (total / max(n, 1) if self.keep_grads else total).backward()
            logits = logits.detach()
            # the scores and the history's loss are the plain cross-entropy
            losses = sample_losses(logits, y) if smoothing else losses.detach()
        if self.keep_grads:
            self.kept_rows = n
            return None, losses, logits
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in self.params
            ]
        )
        return flat.detach(), losses, logits

    def per_sample_grads(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-sample gradients ``(B, n_params)``, the losses and logits.

        Random layers (dropout) draw for each sample its own values, as a
        forward pass over the whole batch in training mode would; vmap's
        default would refuse them.

        Frozen parameters (``requires_grad=False``) get no gradient: their
        columns are zeros, so they add nothing to a score (a norm or a
        projection) and cost no backward pass.
        """
        named = list(self.module.named_parameters())
        params = {k: v.detach() for k, v in named if v.requires_grad}
        frozen = {k: v.detach() for k, v in named if not v.requires_grad}
        buffers = {k: v.detach() for k, v in self.module.named_buffers()}
        module, smoothing = self.module, self.label_smoothing

        def loss_one(p: dict, b: dict, xi: torch.Tensor, yi: torch.Tensor) -> tuple:
            logits = functional_call(module, (p, frozen, b), (xi.unsqueeze(0),)).float()
            loss = F.cross_entropy(logits, yi.unsqueeze(0), label_smoothing=smoothing)
            return loss, logits.squeeze(0)

        step = vmap(
            grad_and_value(loss_one, has_aux=True),
            in_dims=(None, None, 0, 0),
            randomness="different",
        )
        with self._autocast():
            grads, (losses, logits) = step(params, buffers, x, y)
        if smoothing:  # the scores are the plain cross-entropy, as elsewhere
            losses = sample_losses(logits, y)
        n = x.shape[0]
        flat = torch.cat(
            [
                grads[k].reshape(n, -1) if k in grads else x.new_zeros(n, v.numel())
                for k, v in named
            ],
            dim=1,
        )
        return flat, losses, logits
