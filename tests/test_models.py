"""Built-in models: shapes, seeded initialisation, no global RNG, picklable."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import xarray as xr
from torch import nn

from daskpri.models import CNN, MLP, MODELS, MaxPool1d, build_model, cnn, mlp

# Sample shapes of the built-in datasets: mnist1d, digits, mnist5k/mnist, cifar10.
SHAPES = {"mnist1d": (40,), "digits": (8, 8), "mnist5k": (1, 28, 28), "cifar10": (3, 32, 32)}


def dataset(shape: tuple[int, ...], n: int = 16, *, n_classes: int | None = 10) -> xr.Dataset:
    dims = ("sample", *(f"d{i}" for i in range(len(shape))))
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "x": (dims, rng.random((n, *shape), dtype=np.float32)),
            "y": ("sample", np.arange(n) % 7),
        }
    )
    if n_classes is not None:
        ds.attrs["n_classes"] = n_classes
    return ds


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("data", list(SHAPES))
def test_output_is_batch_by_classes(name, data):
    ds = dataset(SHAPES[data])
    model = build_model(name, ds)
    out = model(torch.from_numpy(ds["x"].values[:5]))
    assert out.shape == (5, 10)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_gives_the_same_weights(name):
    a = build_model(name, dataset((40,)), seed=7).state_dict()
    b = build_model(name, dataset((40,)), seed=7).state_dict()
    c = build_model(name, dataset((40,)), seed=8).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("name", MODELS)
def test_global_torch_rng_is_left_alone(name):
    before = torch.random.get_rng_state()
    build_model(name, dataset((1, 28, 28)), seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_weights_follow_torchs_default_bounds():
    model = mlp({"x_shape": (784,), "n_classes": 10})
    bound = 1 / np.sqrt(784)  # kaiming_uniform(a=sqrt(5)) gives the same bound
    for tensor in (model[1].weight.detach(), model[1].bias.detach()):
        assert float(tensor.abs().max()) <= bound
        assert float(tensor.abs().max()) > 0.9 * bound
    assert all(p.device.type == "cpu" and p.requires_grad for p in model.parameters())


def test_mlp_has_one_hidden_layer_of_300():
    model = mlp(dataset((1, 28, 28)))
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 300), (300, 10)]
    assert isinstance(model[2], nn.ReLU)


def test_mlp_hidden_width_is_a_parameter():
    assert mlp(dataset((40,)), hidden=64)[1].out_features == 64


def test_cnn_uses_1d_convolutions_for_vectors_and_2d_for_images():
    # a vector runs through (1, 5) kernels over a one-row image; an image, 3 x 3
    kernels = {shape: [m.kernel_size for m in cnn(dataset(shape)) if isinstance(m, nn.Conv2d)]
               for shape in ((40,), (8, 8))}
    assert kernels == {(40,): [(1, 5), (1, 5)], (8, 8): [(3, 3), (3, 3)]}


@pytest.mark.parametrize("length", [7, 40])
def test_the_1d_cnn_computes_as_1d_layers_and_loads_their_weights(length):
    model = cnn(dataset((length,)), seed=3)
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    # the same weights in 1-D layers: the CNN as it was built before
    ref = model.as_1d_layers()
    assert [type(m) for m in ref if isinstance(m, (nn.Conv1d, nn.MaxPool1d))] == [
        nn.Conv1d, MaxPool1d, nn.Conv1d, MaxPool1d]
    x = torch.randn(6, length, generator=torch.Generator().manual_seed(length))
    y = torch.arange(6) % 10
    outs = []
    for m in (model, ref):
        m.zero_grad()
        out = m(x)
        torch.nn.functional.cross_entropy(out, y).backward()
        outs.append((out.detach(), [p.grad.reshape(-1) for p in m.parameters()]))
    (a, grads_a), (b, grads_b) = outs
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)
    # a state dict of the 1-D layers (a checkpoint saved before) loads, values kept
    other = cnn(dataset((length,)), seed=0)
    other.load_state_dict(ref.state_dict())
    for p, q in zip(other.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert other[4].weight.is_contiguous(memory_format=torch.channels_last)


def test_n_classes_comes_from_labels_without_the_attribute():
    model = build_model("mlp", dataset((40,), n_classes=None))  # labels 0..6
    assert model[-1].out_features == 7


def test_info_dict_from_validate_dataset_is_accepted():
    info = {"n_samples": 10, "x_shape": (8, 8), "x_dtype": "float32", "n_classes": 3}
    assert build_model("cnn", info)(torch.zeros(2, 8, 8)).shape == (2, 3)


def test_info_dict_needs_n_classes():
    info = {"n_samples": 10, "x_shape": (40,), "x_dtype": "float32", "n_classes": None}
    with pytest.raises(ValueError, match=r"ds_or_info should have 'n_classes' set"):
        build_model("mlp", info)


def test_unknown_model_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"model should be one of 'mlp', 'cnn', but got 'resnet'"):
        build_model("resnet", dataset((40,)))


def test_cnn_refuses_inputs_too_small_to_pool():
    with pytest.raises(ValueError, match=r"at least 4, but got samples of shape \(3,\)"):
        cnn({"x_shape": (3,), "n_classes": 2})


@pytest.mark.parametrize("name", MODELS)
def test_models_pickle_by_reference_to_this_module(name):
    model = build_model(name, dataset((40,)))
    clone = pickle.loads(pickle.dumps(model))
    assert type(clone) is {"mlp": MLP, "cnn": CNN}[name]
    x = torch.zeros(3, 40)
    assert torch.equal(clone(x), model(x))


@pytest.mark.parametrize("length", [2, 7, 40])
def test_cnn_pooling_gives_nn_maxpool1d_values_and_gradients(length):
    rng = torch.Generator().manual_seed(length)
    x = torch.randn(3, 4, length, generator=rng)
    x[0, 0, :2] = 0.0  # a tie, as ReLU makes them: torch's pooling takes the first
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = MaxPool1d()(ours), nn.MaxPool1d(2)(theirs)
    assert out.shape == ref.shape == (3, 4, length // 2)
    assert torch.equal(out, ref)
    weights = torch.randn(ref.shape, generator=rng)
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    assert torch.equal(ours.grad, theirs.grad)
    with torch.no_grad():  # nn.MaxPool1d's own path
        assert torch.equal(MaxPool1d()(x), ref)


def test_the_2d_cnn_is_channels_last_and_computes_as_a_contiguous_one():
    model = cnn(dataset((1, 28, 28)), seed=3)
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert not convs[1].weight.is_contiguous()
    plain = copy.deepcopy(model)
    for p in plain.parameters():
        p.data = p.data.clone(memory_format=torch.contiguous_format)
    assert [c.weight.is_contiguous() for c in plain if isinstance(c, nn.Conv2d)] == [True] * 2
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(model(x), plain(x), atol=1e-5)
