"""An xarray user's own data: layouts daskpri takes as meant, and those it refuses saying how.

Features whose ``sample`` dimension is not first are transposed, lazily;
labels stored as whole-number floats (or bools) are cast to int64, each
value checked where it is read; names and dtypes daskpri cannot take are
refused at once with the line of xarray that mends them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from daskpri.data import open_dataset, to_store, validate_dataset


def small(n: int = 20, n_features: int = 3) -> xr.Dataset:
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {
            "x": (("sample", "feature"), rng.normal(size=(n, n_features)).astype(np.float32)),
            "y": ("sample", rng.integers(0, 4, size=n)),
        },
        attrs={"n_classes": 4},
    )


# --- x with 'sample' elsewhere than first -----------------------------------


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_x_whose_sample_dimension_is_not_first_is_transposed_lazily(tmp_path, suffix):
    rng = np.random.default_rng(1)
    images = rng.normal(size=(4, 5, 2, 30)).astype(np.float32)  # (h, w, channel, sample)
    ds = xr.Dataset({"x": (("h", "w", "channel", "sample"), images),
                     "y": ("sample", np.arange(30) % 3)})
    path = to_store(ds.chunk({"sample": 10}), tmp_path / f"data{suffix}")
    opened = open_dataset(path)
    assert opened["x"].dims == ("sample", "h", "w", "channel")
    assert opened["x"].chunks is not None  # still the file's, read a slice at a time
    np.testing.assert_array_equal(
        opened["x"].isel(sample=slice(10, 20)).values, images[..., 10:20].transpose(3, 0, 1, 2)
    )
    assert validate_dataset(ds)["x_shape"] == (4, 5, 2)  # as open_dataset lays it out
    in_memory = open_dataset(ds.transpose("sample", ...))
    assert open_dataset(in_memory) is in_memory  # nothing to change: as it is


# --- labels as floats or bools -----------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "bool"])
def test_whole_number_float_and_bool_labels_are_cast_to_int64(dtype):
    ds = small()
    y = ds["y"].values % 2 if dtype == "bool" else ds["y"].values
    opened = open_dataset(ds.assign(y=("sample", y.astype(dtype))))
    assert opened["y"].dtype == np.int64
    np.testing.assert_array_equal(opened["y"].values, y)


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_integer_labels_stored_with_a_fill_value_open_as_integers_unless_one_is_missing(
    tmp_path, suffix
):
    ds = small()
    encoding = {"y": {"_FillValue": -1}}  # xarray decodes y as floats, NaN for a -1
    whole = tmp_path / f"whole{suffix}"
    if suffix == ".nc":
        ds.to_netcdf(whole, engine="h5netcdf", encoding=encoding)
    else:
        ds.to_zarr(whole, encoding=encoding, consolidated=False)
    opened = open_dataset(whole)
    assert opened["y"].dtype == np.int64
    np.testing.assert_array_equal(opened["y"].values, ds["y"].values)

    y = ds["y"].values.copy()
    y[7] = -1
    gap = tmp_path / f"gap{suffix}"
    if suffix == ".nc":
        ds.assign(y=("sample", y)).to_netcdf(gap, engine="h5netcdf", encoding=encoding)
    else:
        ds.assign(y=("sample", y)).chunk({"sample": 5}).to_zarr(
            gap, encoding=encoding, consolidated=False)
    with pytest.raises(
        ValueError,
        match=r"^data.y should hold whole-number class labels \(floats such as 3.0 are taken "
        r"as the integer 3\), but got nan at sample 7 \(1 such label in samples \d+-\d+\): the "
        r"file stores y as int64 with _FillValue=-1, .* drop the samples whose label is -1",
    ):
        open_dataset(gap)["y"].load()  # read lazily, a chunk at a time: the chunk's range


@pytest.mark.parametrize("bad", [np.nan, 2.5, np.inf, 1e30])
def test_a_label_that_is_not_a_whole_number_is_refused_naming_its_sample(bad):
    y = small()["y"].values.astype(np.float64)
    y[[4, 11]] = bad
    with pytest.raises(
        ValueError,
        match=r"^train.y should hold whole-number class labels .*, but got "
        + re.escape(repr(bad)) + r" at sample 4 \(2 such labels in samples 0-19\); give "
        r"each sample its class as an integer, or drop the unlabelled$",
    ):
        open_dataset(small().assign(y=("sample", y)), name="train")


# --- what is refused, with the mend --------------------------------------------

_DS = small()
_REFUSED = {
    "a DataArray": (
        _DS["x"], TypeError,
        r"but got an object of type DataArray: a DataArray holds the features alone; put them "
        r"and the labels in one Dataset, as 'x' and 'y' along 'sample': "
        r"xr.Dataset\(\{'x': features, 'y': labels\}\)",
        None,
    ),
    "variables named image and label": (
        _DS.rename(x="image", y="label"), ValueError,
        r"data should have a variable 'x', but got variables \('image', 'label'\); daskpri "
        r"reads the features from 'x' and the labels from 'y': "
        r"ds.rename\(\{'image': 'x', 'label': 'y'\}\)$",
        lambda ds: ds.rename({"image": "x", "label": "y"}),
    ),
    "labels as a coordinate": (
        _DS.set_coords("y"), ValueError,
        r"data should have a variable 'y', but got variables \('x',\); 'y' is a coordinate "
        r"of it, not a variable: ds.reset_coords\('y'\)$",
        lambda ds: ds.reset_coords("y"),
    ),
    "a sample dimension of another name": (
        _DS.rename(sample="time"), ValueError,
        r"data should have a 'sample' dimension, but got dimensions \('time', 'feature'\); "
        r"name the dimension samples lie along 'sample': ds.rename\(\{'time': 'sample'\}\)$",
        lambda ds: ds.rename({"time": "sample"}),
    ),
    "labels that are names": (
        _DS.assign(y=("sample", np.array(list("abcd"))[_DS["y"].values])), TypeError,
        r"data.y should have an integer dtype \(or floats that are whole numbers\), but got "
        r"<U1; labels that are names should be numbered: codes, classes = "
        r"pandas.factorize\(ds\['y'\].values\); ds\['y'\] = \('sample', codes\)",
        lambda ds: ds.assign(y=("sample", pd.factorize(ds["y"].values)[0])),
    ),
    "labels along sample and a dimension of one": (
        _DS.assign(y=_DS["y"].expand_dims("k", axis=1)), ValueError,
        r"data.y should have dims \('sample',\), .* but got dims \('sample', 'k'\); drop the "
        r"others: ds\['y'\] = ds\['y'\].squeeze\(\['k'\], drop=True\)$",
        lambda ds: ds.assign(y=ds["y"].squeeze(["k"], drop=True)),
    ),
    "bool features": (
        _DS.assign(x=_DS["x"] > 0), TypeError,
        r"data.x should have an integer or float dtype, but got bool; "
        r"ds\['x'\] = ds\['x'\].astype\('float32'\)$",
        lambda ds: ds.assign(x=ds["x"].astype("float32")),
    ),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_data_daskpri_cannot_take_is_refused_with_the_line_that_mends_it(case):
    data, error, match, mend = _REFUSED[case]
    with pytest.raises(error, match=match):
        open_dataset(data)
    if mend is not None:  # the mend the message gives
        assert validate_dataset(open_dataset(mend(data)))["n_samples"] == 20


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_a_file_whose_splits_are_groups_is_refused_naming_them_and_the_line_that_mends_it(
    tmp_path, suffix
):
    import warnings

    import h5py

    path = str(tmp_path / f"splits{suffix}")
    for mode, group in (("w", "test"), ("a", "train")):  # xarray's way to keep splits together
        if suffix == ".nc":
            small().to_netcdf(path, group=group, engine="h5netcdf", mode=mode)
        else:
            with warnings.catch_warnings():  # zarr's, of consolidated metadata in format 3
                warnings.simplefilter("ignore")
                small().to_zarr(path, group=group, mode=mode)
    with pytest.raises(ValueError) as refused:
        open_dataset(path)
    opened = (f"xr.open_dataset({path!r}, group='train', chunks={{}})" if suffix == ".nc"
              else f"xr.open_zarr({path!r}, group='train')")
    assert str(refused.value) == (
        f"data should hold its variables at the top of {path!r}, where daskpri reads them, "
        "but its top holds none, and it has the groups ['test', 'train']: write the one to "
        f"train on to a store of its own (daskpri.data.to_store({opened}, 'train.zarr')), or "
        "pass it opened as a Dataset")
    mended = to_store(eval(opened), str(tmp_path / "train.zarr"))  # the line it gives
    assert validate_dataset(open_dataset(mended))["n_samples"] == 20
    if suffix == ".nc":  # an HDF5 file that is not netCDF (h5py's): refused, no warning
        with h5py.File(tmp_path / "plain.h5", "w") as f:
            f["x"], f["y"] = np.zeros((4, 3)), np.arange(4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(ValueError, match=r"^data should have a 'sample' dimension"):
                open_dataset(str(tmp_path / "plain.h5"))


def test_categorical_labels_are_refused_saying_to_number_them():
    ds = small().assign(y=("sample", pd.Categorical(np.array(list("abcd"))[small()["y"]])))
    with pytest.raises(TypeError, match=r"but got category; labels that are names should be "
                       r"numbered: codes, classes = pandas.factorize"):
        validate_dataset(ds)


def test_build_model_counts_the_classes_of_float_labels_and_refuses_a_missing_one():
    from daskpri.models import build_model

    ds = small().drop_attrs().assign(y=lambda d: d["y"].astype(np.float32))
    assert build_model("mlp", ds)(torch.zeros(2, 3)).shape == (2, int(ds["y"].max()) + 1)
    y = ds["y"].values.copy()
    y[2] = np.nan
    with pytest.raises(ValueError, match=r"^ds_or_info.y should hold whole-number class labels "
                       r".*, but got nan at sample 2 "):
        build_model("mlp", ds.assign(y=("sample", y)).chunk({"sample": 10}))


def test_eval_datas_dimensions_are_lined_up_with_the_training_datas_by_name():
    from daskpri.training._checks import open_data

    rng = np.random.default_rng(2)
    images = rng.normal(size=(6, 4, 3, 2)).astype(np.float32)  # (sample, h, w, channel)
    train = xr.Dataset({"x": (("sample", "h", "w", "channel"), images),
                        "y": ("sample", np.arange(6) % 2)})
    test = train.transpose("channel", "sample", "w", "h")  # as another tool wrote it
    _, info, evalset = open_data(train, test)
    assert info["x_shape"] == (4, 3, 2)
    np.testing.assert_array_equal(evalset.x.numpy(), images)
    with pytest.raises(ValueError, match=r"^eval_data.x should have per-sample shape \(4, 3, 2\) "
                       r"like data.x, but got \(4, 3\) \(data.x's dimensions besides 'sample' "
                       r"are \('h', 'w', 'channel'\), eval_data.x's \('h', 'w'\)\)$"):
        open_data(train, train.isel(channel=0, drop=True))


def test_eval_data_of_the_same_shape_under_other_dimension_names_is_refused_saying_to_rename(
    tmp_path,
):
    from daskpri.training._checks import open_data

    train = small().rename({"feature": "pixel"})
    test = small(8)  # (sample, feature): as many features as train's pixels, yet others
    with pytest.raises(ValueError, match=re.escape(
        "eval_data.x's dimensions besides 'sample' should be data.x's ('pixel',), as xarray "
        "lines them up by name, but got ('feature',) of the same shape; where they are the "
        "same features, rename them: eval_data = eval_data.rename({'feature': 'pixel'})"
    ) + "$"):
        open_data(train, test)
    # renamed as it says, a store's eval_data of matching names (written as by another tool,
    # sample last) is taken, lined up with data's x
    path = to_store(test.rename({"feature": "pixel"}).transpose("pixel", "sample"),
                    tmp_path / "test.nc")
    _, info, evalset = open_data(train, path)
    assert info["x_shape"] == (3,)
    np.testing.assert_array_equal(evalset.x.numpy(), test["x"].values)
