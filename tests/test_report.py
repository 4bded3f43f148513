"""The static report of a finished run, and the dashboard's notebook entry point."""

from __future__ import annotations

import base64
import gzip
import html
import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster

import daskpri
from daskpri.dashboard.notebook import dashboard_url, in_jupyter, show
from daskpri.dashboard.report import REQUIRED_VARIABLES, load_history, write_report
from daskpri.data.io import to_store
from daskpri.models import build_model
from daskpri.table.plugin import PLUGIN_NAME

# -- reading the page back ---------------------------------------------------------------


def bokeh_sources(page: str) -> dict[str, dict[str, np.ndarray]]:
    """The named ColumnDataSources of a ``file_html`` page, decoded into arrays."""
    script = r'<script type="application/json" id="[^"]*">\s*(.*?)\s*</script>'
    found = re.findall(script, page, re.S)
    assert len(found) == 1, "the page should hold one Bokeh document"
    (doc,) = json.loads(found[0]).values()
    sources: dict[str, dict[str, np.ndarray]] = {}
    for obj in _walk(doc):
        attrs = obj.get("attributes", {})
        if obj.get("name") == "ColumnDataSource" and attrs.get("name"):
            sources[attrs["name"]] = {k: _column(v) for k, v in attrs["data"]["entries"]}
    return sources


def _walk(obj: Any) -> Any:
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def _column(value: Any) -> np.ndarray:
    if isinstance(value, dict) and value.get("type") == "ndarray":
        raw = base64.b64decode(value["array"]["data"])
        if raw[:2] == b"\x1f\x8b":  # Bokeh gzips large arrays
            raw = gzip.decompress(raw)
        return np.frombuffer(raw, dtype=value["dtype"]).reshape(value["shape"])
    return np.asarray(value)


def finite(values: Any) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values[np.isfinite(values)]


# -- histories ---------------------------------------------------------------------------


def hand_made(
    accuracy: list[float], time: list[float] | None = None, strategy: str = "loss", **attrs: Any
) -> xr.Dataset:
    """A history of ``len(accuracy)`` steps, as the recorder lays one out."""
    n = len(accuracy)
    t = np.arange(1, n + 1, dtype=np.float64) if time is None else np.asarray(time, float)
    data = {
        "time": t,
        "loss": np.linspace(2.5, 0.5, n),
        "accuracy": np.asarray(accuracy, dtype=np.float64),
        "samples": 128.0 * np.arange(1, n + 1),
        "samples_per_second": np.full(n, 1000.0),
        "step_time": np.full(n, 0.05),
        "compute_time": np.full(n, 0.01),
        "communication_time": np.full(n, 0.03),
        "selection_time": np.full(n, 0.006),
        "optimizer_time": np.full(n, 0.004),
    }
    ds = xr.Dataset(
        {k: ("step", v) for k, v in data.items()},
        coords={"step": np.arange(n), "worker": np.arange(2)},
        attrs={"strategy": strategy, "seed": 7, "n_workers": 2, **attrs},
    )
    ds["worker_samples"] = (("step", "worker"), np.full((n, 2), 64.0))
    return ds


@pytest.fixture(scope="module")
def fitted(small_data) -> dict[str, xr.Dataset]:
    """Histories of two short real fits on a two-worker LocalCluster."""
    train, test = small_data
    histories = {}
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            protocol="tcp://",  # inproc comms would not take a host
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        for strategy in ("uniform", "selective-backprop"):
            model = build_model("mlp", train, seed=0)
            with daskpri.Trainer(model, strategy=strategy, client=client, eval_every=4) as trainer:
                histories[strategy] = trainer.fit(
                    train, eval_data=test, max_steps=12, progress=False
                )
    return histories


# -- the report --------------------------------------------------------------------------


def test_report_of_a_real_fit_holds_its_curves(fitted, tmp_path: Path) -> None:
    run, base = fitted["selective-backprop"], fitted["uniform"]
    to_store(run, tmp_path / "run.nc")
    to_store(base, tmp_path / "base.zarr")
    out = tmp_path / "out" / "report.html"
    assert write_report(tmp_path / "run.nc", out, baseline=tmp_path / "base.zarr") == str(out)
    page = out.read_text(encoding="utf-8")
    sources = bokeh_sources(page)
    np.testing.assert_allclose(sources["daskpri-loss"]["loss"], finite(run["loss"]))
    np.testing.assert_allclose(sources["daskpri-baseline-loss"]["loss"], finite(base["loss"]))
    np.testing.assert_allclose(sources["daskpri-accuracy"]["accuracy"], finite(run["accuracy"]))
    np.testing.assert_allclose(
        sources["daskpri-report-samples-per-second"]["samples_per_second"],
        run["samples_per_second"],
    )
    assert sources["daskpri-step-times"]["step"].tolist() == list(range(12))
    for attr in ("selective-backprop", "uniform", "run.nc", "base.zarr", "seed"):
        assert attr in page


def test_report_is_self_contained(tmp_path: Path) -> None:
    page = Path(write_report(hand_made([0.5, 0.7]), tmp_path / "r.html")).read_text()
    assert "Bokeh.embed" in page and "<title>daskpri report: loss</title>" in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page), "scripts should be inline"
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']https?:", page)
    assert "https://cdn.bokeh.org" not in page


def test_report_of_a_hand_made_history_with_baseline(tmp_path: Path) -> None:
    run = hand_made([0.5, 0.8], strategy="projection", strategy_params="Projection(k=32)")
    base = hand_made([0.5, np.nan, np.nan, np.nan, 0.8], strategy="uniform")
    base["time"] = ("step", [2.0, 3.0, 4.0, 4.5, 5.0])
    out = write_report(run, tmp_path / "r.html", baseline=base, title="runs <compared>")
    page = Path(out).read_text()
    sources = bokeh_sources(page)
    # 0.5 was reached at both runs' first evaluation (t=1 and t=2), 0.8 at t=2 and t=5.
    assert sources["daskpri-speedup"]["level"].tolist() == pytest.approx(
        [0.5] + [round(0.51 + i / 100, 2) for i in range(30)]
    )
    assert sources["daskpri-speedup"]["speedup"].tolist() == pytest.approx([2.0] + [2.5] * 30)
    np.testing.assert_allclose(sources["daskpri-loss"]["loss"], run["loss"])
    np.testing.assert_allclose(sources["daskpri-baseline-loss"]["loss"], base["loss"])
    assert "2.50x" in page and "2.00x" in page
    assert html.escape("Projection(k=32)") in page
    assert html.escape("runs <compared>") in page and "runs <compared>" not in page


def test_report_never_replaces_its_histories_nor_compares_other_data(tmp_path: Path) -> None:
    run, base = hand_made([0.5, 0.8]), hand_made([0.5, 0.7], strategy="uniform")
    run.attrs.update(dataset="mnist1d", model="mlp")
    base.attrs.update(dataset="digits", model="mlp")
    to_store(run, str(tmp_path / "run.nc"))
    to_store(base, str(tmp_path / "base.nc"))
    before = (tmp_path / "run.nc").read_bytes()
    for output, name in ((tmp_path / "run.nc", "history"), (tmp_path / "base.nc", "baseline"),
                         (tmp_path / "." / "run.nc", "history")):
        with pytest.raises(ValueError, match=f"is the {name} itself: writing the page there "
                           "would replace it"):
            write_report(str(tmp_path / "run.nc"), output, baseline=str(tmp_path / "base.nc"))
    assert (tmp_path / "run.nc").read_bytes() == before
    with pytest.raises(ValueError, match=r"the baseline trained on other data or another model: "
                       r"dataset 'digits' \(the run's: 'mnist1d'\)"):
        write_report(run, tmp_path / "r.html", baseline=base)
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(ValueError, match=re.escape(
        f"output_html should be a file's path, but got {str(tmp_path)!r}, which is a directory"
    )):
        write_report(run, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.nc", "run.nc"]


def test_report_of_a_run_never_evaluated(tmp_path: Path) -> None:
    page = Path(write_report(hand_made([np.nan] * 3), tmp_path / "r.html")).read_text()
    assert "not evaluated" in page
    assert bokeh_sources(page)["daskpri-accuracy"]["accuracy"].size == 0


def test_report_replaces_the_file_atomically(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    out.write_text("<!DOCTYPE html><p>an older report</p>")
    write_report(hand_made([0.5]), out)
    write_report(hand_made([0.6]), out)
    assert os.listdir(tmp_path) == ["report.html"]
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_report_never_replaces_a_file_that_is_not_a_page(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("# mine")
    with pytest.raises(ValueError, match=re.escape(
        f"output_html {str(notes)!r} holds a file that is not an HTML page: writing the "
        "report would replace it")):
        write_report(hand_made([0.5]), notes)
    assert notes.read_text() == "# mine"


@pytest.mark.parametrize("missing", ["loss", "accuracy", "communication_time"])
def test_history_without_a_variable_is_refused_by_name(missing: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"history should have the per-step variable '{missing}'"):
        write_report(hand_made([0.5]).drop_vars(missing), tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_baseline_without_a_variable_is_refused_by_name(tmp_path: Path) -> None:
    base = hand_made([0.5]).drop_vars("samples_per_second")
    with pytest.raises(ValueError, match="baseline should have .*'samples_per_second'"):
        write_report(hand_made([0.5]), tmp_path / "r.html", baseline=base)


def test_history_file_missing_variable_is_refused_by_name(tmp_path: Path) -> None:
    path = to_store(hand_made([0.5, 0.6]).drop_vars("time"), tmp_path / "h.nc")
    with pytest.raises(ValueError, match="per-step variable 'time'"):
        write_report(path, tmp_path / "r.html")


def test_history_that_is_not_a_history_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="should have a 'step' dimension"):
        load_history(xr.Dataset({"loss": ("sample", [1.0])}))
    with pytest.raises(ValueError, match="has no step"):
        load_history(hand_made([0.5]).isel(step=slice(0, 0)))
    with pytest.raises(ValueError, match="not a readable netcdf history"):
        (tmp_path / "bad.nc").write_text("not netCDF")
        load_history(tmp_path / "bad.nc")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_history(tmp_path / "missing.nc")
    with pytest.raises(TypeError, match="history should be an xarray.Dataset or the path"):
        load_history(42)  # type: ignore[arg-type]


def test_history_reading_another_file_is_refused(tmp_path: Path) -> None:
    import h5py

    secret = tmp_path / "secret.nc"
    to_store(xr.Dataset({"loss": ("step", [9.0, 9.0])}), secret)
    path = to_store(hand_made([0.5, 0.6]), tmp_path / "h.nc")
    load_history(path)  # as written, read
    with h5py.File(path, "a") as f:  # a crafted history: one variable from another file
        f["stolen"] = h5py.ExternalLink(str(secret), "/loss")
    with pytest.raises(ValueError, match=re.escape(
            f"history should be a netCDF file that holds all its values itself, with no HDF5 "
            f"external storage, external links or virtual datasets, but in {str(path)!r} variable "
            f"'stolen' is an external link to '/loss' in {str(secret)!r}")):
        load_history(path)
    with pytest.raises(ValueError, match="variable 'stolen' is an external link"):
        write_report(path, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_required_variables_are_those_the_recorder_writes() -> None:
    from daskpri.training.history import STEP_VARIABLES

    assert set(REQUIRED_VARIABLES) <= set(STEP_VARIABLES)


# -- the dashboard outside Jupyter -------------------------------------------------------


def test_show_outside_jupyter_prints_and_returns_the_page(capsys: pytest.CaptureFixture) -> None:
    assert not in_jupyter()
    with (
        LocalCluster(
            n_workers=1,
            processes=False,
            protocol="tcp://",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        url = show(client)  # registers daskpri's plugin, which serves the page
        port = cluster.scheduler.http_server.port
        assert url == f"http://127.0.0.1:{port}/daskpri" == dashboard_url(client)
        assert capsys.readouterr().out == f"daskpri dashboard: {url}\n"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
        assert PLUGIN_NAME in cluster.scheduler.plugins
        assert show(client) == url  # the plugin is registered once


def test_the_cli_links_the_dashboard_and_the_page_once_it_is_served() -> None:
    from daskpri.cli._summary import _dashboard
    from daskpri.table.plugin import RemoteTable

    with (
        LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1",
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        assert _dashboard(client) == f"{base}/status"  # the page comes with daskpri's plugin
        RemoteTable.ensure_plugin(client)
        assert _dashboard(client) == f"{base}/status (daskpri's page: {base}/daskpri)"


def test_show_refuses_bad_arguments() -> None:
    with pytest.raises(TypeError, match="client should be a distributed.Client"):
        show("tcp://127.0.0.1:8786")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="height should be a positive integer"):
        show(None, height=0)  # type: ignore[arg-type]


def test_show_without_a_dashboard_says_how_to_get_one() -> None:
    with (
        LocalCluster(
            n_workers=0,
            processes=False,
            protocol="tcp://",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            # the scheduler's HTTP server (health, metrics) without Bokeh's pages
            scheduler_kwargs={"dashboard": False},
        ) as cluster,
        Client(cluster) as client,
    ):
        assert client.dashboard_link  # of an HTTP server without the page it names
        with pytest.raises(RuntimeError, match=(
            r"the scheduler serves no Bokeh dashboard, so there is no /daskpri page: .* or "
            rf"serve the page from this machine with `daskpri dashboard --scheduler "
            rf"{cluster.scheduler_address}`"
        )):
            dashboard_url(client)
        with pytest.raises(RuntimeError, match="the scheduler serves no Bokeh dashboard"):
            show(client)
