"""Built-in models, shaped from a dataset: the paper's MLP and a small CNN.

The classes live in this importable module so that workers, which start by
spawn, can unpickle them. Weights are drawn from a ``torch.Generator`` seeded
by the caller; torch's global generator is never used.

Examples
--------
>>> import daskpri
>>> daskpri.models.MODELS
('mlp', 'cnn')
>>> train, test = daskpri.datasets.load("digits")
>>> model = daskpri.models.build_model("cnn", train, seed=0)
>>> model(torch.as_tensor(train.x.values[:4])).shape
torch.Size([4, 10])
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any, cast

import torch
import xarray as xr
from torch import nn

# the names :func:`build_model` takes
from daskpri._choices import MODELS as MODELS
from daskpri.data._persisted import driver_scheduler
from daskpri.data.io import open_dataset, validate_dataset

__all__ = ["CNN", "MLP", "MaxPool1d", "MODELS", "build_model", "cnn", "from_spec", "mlp"]

DatasetOrInfo = xr.Dataset | dict[str, Any]


class MLP(nn.Sequential):
    """One hidden layer with ReLU: ``Flatten, Linear, ReLU, Linear``.

    Parameters
    ----------
    in_shape : sequence of int
        The shape of one sample (without the batch dimension).
    n_classes : int
        The number of outputs.
    hidden : int, default 300
        The width of the hidden layer (the paper uses 300).
    seed : int, default 0
        Seeds the weights' generator.

    Examples
    --------
    >>> model = MLP((40,), 10)
    >>> model(torch.zeros(8, 40)).shape
    torch.Size([8, 10])
    """

    def __init__(
        self, in_shape: Sequence[int], n_classes: int, hidden: int = 300, *, seed: int = 0
    ) -> None:
        n_in = math.prod(in_shape)
        # Layers are made on the meta device (no memory, no random draws) and
        # then filled from the seeded generator.
        super().__init__(
            nn.Flatten(),
            nn.Linear(n_in, hidden, device="meta"),
            nn.ReLU(),
            nn.Linear(hidden, n_classes, device="meta"),
        )
        _materialize(self, seed)
        #: the constructor's arguments: a checkpoint rebuilds the model from them
        self.spec = {
            "name": "mlp",
            "in_shape": [int(s) for s in in_shape],
            "n_classes": int(n_classes),
            "hidden": int(hidden),
        }


class MaxPool1d(nn.MaxPool1d):
    """``nn.MaxPool1d(2)``, with a backward pass about 1.7x faster on CPU.

    Where a gradient is needed, ``nn.MaxPool1d`` runs torch's 2-D pooling
    with indices, a third of the `CNN`'s training step on MNIST-1D on CPU
    (torch 2.13); the max over pairs (``unflatten`` and ``max``) gives the
    same values and gradients, and made the step 1.05x-1.29x faster over
    eight timings (``benchmarks/cnn_step.py`` among them). Without a
    gradient it is ``nn.MaxPool1d``, which is faster there.

    Examples
    --------
    >>> x = torch.tensor([[[1.0, 3.0, 2.0, 0.0, 5.0]]], requires_grad=True)
    >>> MaxPool1d()(x)
    tensor([[[3., 2.]]], grad_fn=<MaxBackward0>)
    """

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pool pairs along the last axis: as ``nn.MaxPool1d(2)`` computes it.

        Parameters
        ----------
        x : torch.Tensor, shape (..., L)
            The input; an odd last element is dropped.

        Returns
        -------
        torch.Tensor, shape (..., L // 2)
            The maximum of each pair.

        Examples
        --------
        >>> MaxPool1d()(torch.tensor([[[1.0, 3.0, 2.0, 0.0]]]))
        tensor([[[3., 2.]]])
        """
        if not (torch.is_grad_enabled() and x.requires_grad):
            return super().forward(x)
        half = x.shape[-1] // 2  # an odd last element is dropped, as by nn.MaxPool1d
        return x[..., : 2 * half].unflatten(-1, (half, 2)).max(-1).values


class CNN(nn.Sequential):
    """A small CNN: two convolution + ReLU + max-pool blocks, then a linear layer.

    Inputs of shape ``(L,)`` are seen as one channel of length ``L`` (1-D
    convolutions, kernel 5, run as 2-D ones of kernel ``(1, 5)`` over a
    ``(1, L)`` image); ``(H, W)`` as one channel of an image and
    ``(C, H, W)`` as ``C`` channels (2-D convolutions, kernel 3). Every
    spatial size should be at least 4, as each block halves it.

    The convolutions' weights are channels-last (``torch.channels_last``),
    so their activations are too: on CPU that made a forward pass of the
    ``mnist5k`` CNN about 2x faster and a training step 1.24x-1.47x
    (``benchmarks/cnn_step.py``), mostly in max pooling; for MNIST-1D's
    ``(40,)``, a training step of 64 samples 1.4x faster and a forward pass
    of 128 1.2x than as 1-D convolutions and pooling. The weights' values
    do not depend on it (the same seed draws the same ones), and a state
    dict of the 1-D layers' weight shapes (``(out, in, 5)``, saved before
    this layout) loads.

    Parameters
    ----------
    in_shape : sequence of int
        The shape of one sample: ``(L,)``, ``(H, W)`` or ``(C, H, W)``.
    n_classes : int
        The number of outputs.
    seed : int, default 0
        Seeds the weights' generator.

    Examples
    --------
    >>> model = CNN((1, 28, 28), 10)
    >>> model(torch.zeros(8, 1, 28, 28)).shape
    torch.Size([8, 10])
    """

    def __init__(self, in_shape: Sequence[int], n_classes: int, *, seed: int = 0) -> None:
        shape = tuple(int(s) for s in in_shape)
        if len(shape) not in (1, 2, 3):
            raise ValueError(
                f"cnn needs samples of shape (L,), (H, W) or (C, H, W), but got {shape}"
            )
        spatial = shape[-1:] if len(shape) == 1 else shape[-2:]
        if min(spatial) < 4:
            raise ValueError(
                f"cnn halves each spatial size twice, so it needs sizes of at least 4, "
                f"but got samples of shape {shape}"
            )
        meta = torch.device("meta")
        layers: list[nn.Module]
        if len(shape) == 1:
            (length,) = shape
            # (N, L) -> (N, 1, 1, L): a one-row image, for the channels-last 2-D kernels
            layers = [
                nn.Unflatten(1, (1, 1, length)),
                nn.Conv2d(1, 32, (1, 5), padding=(0, 2), device=meta),
                nn.ReLU(),
                nn.MaxPool2d((1, 2)),
                nn.Conv2d(32, 64, (1, 5), padding=(0, 2), device=meta),
                nn.ReLU(),
                nn.MaxPool2d((1, 2)),
            ]
            n_flat = 64 * (length // 4)
        else:
            channels, height, width = shape if len(shape) == 3 else (1, *shape)
            # (N, H, W) -> (N, 1, H, W): unflatten the H axis into (1, H).
            layers = [nn.Unflatten(1, (1, height))] if len(shape) == 2 else []
            layers += [
                nn.Conv2d(channels, 32, 3, padding=1, device=meta),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1, device=meta),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            n_flat = 64 * (height // 4) * (width // 4)
        super().__init__(*layers, nn.Flatten(), nn.Linear(n_flat, n_classes, device=meta))
        _materialize(self, seed)
        self.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # not in the stubs
        if len(shape) == 1:
            self.register_load_state_dict_pre_hook(_conv1d_weights_as_2d)
        #: the constructor's arguments: a checkpoint rebuilds the model from them
        self.spec = {"name": "cnn", "in_shape": list(shape), "n_classes": int(n_classes)}

    def as_1d_layers(self) -> nn.Sequential:
        """A 1-D CNN as ``nn.Conv1d`` layers, with copies of its weights.

        What the CNN computes on vectors, in the layers it was built of
        before it ran them as 2-D ones (kernels ``5``, `MaxPool1d`): a
        reference for tests and timings (``benchmarks/cnn_step.py``).

        Returns
        -------
        torch.nn.Sequential
            ``Conv1d`` layers with copies of this CNN's weights (they do
            not share them), then the same flatten and linear layer.

        Raises
        ------
        ValueError
            If the CNN was not built for samples of one axis.

        Examples
        --------
        >>> model = CNN((40,), 10)
        >>> x = torch.randn(3, 40)
        >>> torch.allclose(model(x), model.as_1d_layers()(x), atol=1e-5)
        True
        >>> CNN((8, 8), 10).as_1d_layers()
        Traceback (most recent call last):
        ...
        ValueError: as_1d_layers needs a CNN of vectors (one axis), but got in_shape=[8, 8]
        """
        shape = cast(list[int], self.spec["in_shape"])
        if len(shape) != 1:
            raise ValueError(
                "as_1d_layers needs a CNN of vectors (one axis), but got "
                f"in_shape={shape}"
            )
        layers: list[nn.Module] = [nn.Unflatten(1, (1, shape[0]))]
        for conv in (m for m in self if isinstance(m, nn.Conv2d)):
            one_d = nn.Conv1d(conv.in_channels, conv.out_channels, 5, padding=2)
            with torch.no_grad():
                one_d.weight.copy_(conv.weight.squeeze(2))
                cast(torch.Tensor, one_d.bias).copy_(cast(torch.Tensor, conv.bias))
            layers += [one_d, nn.ReLU(), MaxPool1d()]
        return nn.Sequential(*layers, nn.Flatten(), copy.deepcopy(self[-1]))


def _conv1d_weights_as_2d(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """Give a 1-D `CNN`'s state dict of ``(out, in, k)`` conv weights ``(out, in, 1, k)``.

    The 1-D CNN ran ``nn.Conv1d`` layers before it ran them as 2-D ones: a
    state dict saved then has the same values, one axis fewer.
    """
    for key in (f"{prefix}1.weight", f"{prefix}4.weight"):
        weight = state_dict.get(key)
        if isinstance(weight, torch.Tensor) and weight.dim() == 3:
            state_dict[key] = weight.unsqueeze(2)


def mlp(ds_or_info: DatasetOrInfo, hidden: int = 300, *, seed: int = 0) -> MLP:
    """The paper's MLP, one hidden layer of ``hidden`` units, shaped for a dataset.

    Parameters
    ----------
    ds_or_info : xarray.Dataset or dict
        A training dataset, or the dict `validate_dataset` returns with
        ``n_classes`` filled in.
    hidden : int, default 300
        The width of the hidden layer.
    seed : int, default 0
        Seeds the weights' generator.

    Returns
    -------
    MLP
        The model, its weights drawn from ``seed``.

    Examples
    --------
    >>> model = mlp({"x_shape": (40,), "n_classes": 10})
    >>> model[1]
    Linear(in_features=40, out_features=300, bias=True)
    """
    in_shape, n_classes = _shape_and_classes(ds_or_info)
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"hidden should be a positive integer, but got hidden={hidden!r}")
    return MLP(in_shape, n_classes, hidden, seed=seed)


def cnn(ds_or_info: DatasetOrInfo, *, seed: int = 0) -> CNN:
    """A small CNN shaped for a dataset (see `CNN` for the layers).

    Parameters
    ----------
    ds_or_info : xarray.Dataset or dict
        A training dataset, or the dict `validate_dataset` returns with
        ``n_classes`` filled in.
    seed : int, default 0
        Seeds the weights' generator.

    Returns
    -------
    CNN
        The model, its weights drawn from ``seed``.

    Examples
    --------
    >>> model = cnn({"x_shape": (8, 8), "n_classes": 10})
    >>> model(torch.zeros(2, 8, 8)).shape
    torch.Size([2, 10])
    """
    in_shape, n_classes = _shape_and_classes(ds_or_info)
    return CNN(in_shape, n_classes, seed=seed)


def build_model(name: str, ds_or_info: DatasetOrInfo, seed: int = 0) -> nn.Module:
    """Build the built-in model ``name`` for a dataset, with weights drawn from ``seed``.

    Parameters
    ----------
    name : str
        One of `MODELS`: ``"mlp"`` or ``"cnn"``.
    ds_or_info : xarray.Dataset or dict
        A training dataset, or the dict `validate_dataset` returns with
        ``n_classes`` filled in.
    seed : int, default 0
        Seeds a ``torch.Generator`` for the initial weights; the same seed
        gives the same weights, and torch's global generator is left alone.

    Returns
    -------
    torch.nn.Module
        An :class:`MLP` or a :class:`CNN`.

    Raises
    ------
    ValueError
        If ``name`` is not one of `MODELS`.

    Examples
    --------
    >>> a = build_model("mlp", {"x_shape": (40,), "n_classes": 10}, seed=1)
    >>> b = build_model("mlp", {"x_shape": (40,), "n_classes": 10}, seed=1)
    >>> torch.equal(a[1].weight, b[1].weight)
    True
    """
    if name == "mlp":
        return mlp(ds_or_info, seed=seed)
    if name == "cnn":
        return cnn(ds_or_info, seed=seed)
    allowed = ", ".join(repr(m) for m in MODELS)
    raise ValueError(f"model should be one of {allowed}, but got {name!r}")


def _shape_and_classes(ds_or_info: DatasetOrInfo) -> tuple[tuple[int, ...], int]:
    if isinstance(ds_or_info, xr.Dataset):
        info = validate_dataset(ds_or_info, name="ds_or_info")
        n_classes = info["n_classes"]
        if n_classes is None:
            # Reads the labels, which are small next to the features, here (not on the
            # workers of a default client), as fit reads them: float labels checked whole
            y = open_dataset(ds_or_info, name="ds_or_info")["y"]
            n_classes = int(y.max().compute(scheduler=driver_scheduler(y))) + 1
        return info["x_shape"], n_classes
    if isinstance(ds_or_info, dict):
        for key in ("x_shape", "n_classes"):
            if ds_or_info.get(key) is None:
                raise ValueError(
                    f"ds_or_info should have {key!r} set, as validate_dataset returns it "
                    f"(fill 'n_classes' with max(y) + 1 when the dataset has no such "
                    f"attribute), but got {ds_or_info!r}"
                )
        n_classes = ds_or_info["n_classes"]
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
            raise ValueError(
                f"ds_or_info['n_classes'] should be a positive integer, but got {n_classes!r}"
            )
        return tuple(int(s) for s in ds_or_info["x_shape"]), n_classes
    raise TypeError(
        f"ds_or_info should be an xarray.Dataset or the dict validate_dataset returns, "
        f"but got {type(ds_or_info).__name__}"
    )


def _materialize(model: nn.Module, seed: int) -> None:
    """Allocate ``model``'s meta parameters on the CPU and draw them from ``seed``.

    Draws as torch's default ``reset_parameters`` does for linear and
    convolution layers (Kaiming-uniform weights with ``a=sqrt(5)``, uniform
    biases of bound ``1/sqrt(fan_in)``), but from a private generator.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed should be an integer, but got seed={seed!r}")
    generator = torch.Generator().manual_seed(seed)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
                if module.bias is not None:
                    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(module.weight)
                    bound = 1 / math.sqrt(fan_in)
                    nn.init.uniform_(module.bias, -bound, bound, generator=generator)
            elif any(True for _ in module.parameters(recurse=False)):
                raise TypeError(f"no initialisation is defined for {type(module).__name__}")


def from_spec(spec: dict[str, Any]) -> nn.Module:
    """Rebuild a built-in model from its ``spec`` (weights are loaded after).

    Parameters
    ----------
    spec : dict
        A built-in model's ``spec`` attribute: its constructor's arguments.

    Returns
    -------
    torch.nn.Module
        A new :class:`MLP` or :class:`CNN` of that shape, its weights drawn
        from seed 0 (load the saved ones into it).

    Raises
    ------
    ValueError
        If ``spec["name"]`` is not ``"mlp"`` or ``"cnn"``.

    Examples
    --------
    >>> m = build_model("mlp", {"x_shape": (40,), "n_classes": 10})
    >>> type(from_spec(m.spec)).__name__
    'MLP'
    """
    name = spec.get("name")
    if name == "mlp":
        return MLP(spec["in_shape"], spec["n_classes"], hidden=spec["hidden"])
    if name == "cnn":
        return CNN(spec["in_shape"], spec["n_classes"])
    raise ValueError(f"model spec name should be one of 'mlp', 'cnn', but got {name!r}")
