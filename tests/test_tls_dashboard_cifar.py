"""TLS credentials checked before connecting."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import dask
import pytest
from _procs import refusing_port
from distributed import LocalCluster
from distributed.security import Security

from daskpri.cli import main
from daskpri.training.cluster import lacks_tls_credentials

NO_TLS_CONFIG = {
    "distributed.comm.tls.ca-file": None,
    "distributed.comm.tls.client.cert": None,
    "distributed.comm.tls.client.key": None,
}
TRAIN = ["train", "--no-progress", "--n-samples", "1000", "--max-steps", "3"]


def _tls_config(files: dict[str, str]) -> dict[str, str]:
    return {
        "distributed.comm.tls.ca-file": files["--tls-ca-file"],
        "distributed.comm.tls.client.cert": files["--tls-cert"],
        "distributed.comm.tls.client.key": files["--tls-key"],
    }


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    """A loopback TLS LocalCluster of one worker, and its client's credentials as PEM files."""
    security = Security.temporary()
    folder = tmp_path_factory.mktemp("tls")
    files = {}
    for flag, text in (("--tls-ca-file", security.tls_ca_file),
                       ("--tls-cert", security.tls_client_cert),
                       ("--tls-key", security.tls_client_key)):
        path = folder / f"{flag.strip('-')}.pem"
        path.write_text(text)
        files[flag] = str(path)
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", protocol="tls://",
                      security=security, dashboard_address="127.0.0.1:0") as cluster:
        yield cluster.scheduler_address, files


# -- train: a tls:// scheduler's credentials ------------------------------------------


def test_a_tls_scheduler_without_credentials_is_refused_before_connecting(capsys):
    with refusing_port() as port, dask.config.set(NO_TLS_CONFIG):
        assert main([*TRAIN, "--scheduler", f"tls://127.0.0.1:{port}"]) == 2
    assert capsys.readouterr().err == (
        "daskpri: error: a tls:// scheduler needs --tls-ca-file, --tls-cert and --tls-key (or "
        "Dask's config distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
        f"distributed.comm.tls.client.key), but got --scheduler tls://127.0.0.1:{port} "
        "without them\n"
    )


@pytest.mark.parametrize("flag", ["--tls-ca-file", "--tls-cert", "--tls-key"])
def test_a_missing_tls_file_is_named_before_connecting(flag, tls_cluster, tmp_path, capsys):
    address, files = tls_cluster
    missing = str(tmp_path / "missing.pem")
    given = [arg for f, path in {**files, flag: missing}.items() for arg in (f, path)]
    assert main([*TRAIN, "--scheduler", address, *given]) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: {flag} should be a readable PEM file, but got {flag} {missing!r}, "
        "which does not exist\n"
    )


def test_a_tls_file_ssl_cannot_read_is_named(tls_cluster, tmp_path, capsys):
    address, files = tls_cluster
    junk = tmp_path / "junk.pem"
    junk.write_text("Page not found\n")
    assert main([*TRAIN, "--scheduler", address, "--tls-ca-file", str(junk),
                 "--tls-cert", files["--tls-cert"], "--tls-key", files["--tls-key"]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"daskpri: error: --tls-ca-file {str(junk)!r} holds no CA certificate")
    assert err.count("\n") == 1


def test_connect_refuses_a_tls_address_without_credentials():
    from daskpri.training.cluster import connect

    with dask.config.set(NO_TLS_CONFIG), pytest.raises(
        ValueError, match=r"^the scheduler at tls://127\.0\.0\.1:1 speaks TLS, but no TLS "
                          r"credentials were given"
    ):
        connect("tls://127.0.0.1:1")


def test_a_tls_scheduler_trains_with_the_tls_flags_or_dasks_config(tls_cluster, capsys):
    address, files = tls_cluster
    flags = [arg for item in files.items() for arg in item]
    assert main([*TRAIN, "--scheduler", address, *flags]) == 0
    with dask.config.set(_tls_config(files)):
        assert not lacks_tls_credentials(address)
        assert main([*TRAIN, "--scheduler", address]) == 0  # not refused: Dask's config
    out = capsys.readouterr().out
    assert len(re.findall(r"^[\w-]+: 3 steps,", out, flags=re.M)) == 2, out


# -- dashboard ----------------------------------------------------------------------


def test_dashboard_refuses_a_tls_scheduler_without_dasks_tls_config(capsys):
    from daskpri.dashboard import remote

    def never(*args: Any, **kwargs: Any) -> Any:  # a server started would serve for good
        raise AssertionError("the dashboard started serving")

    with dask.config.set(NO_TLS_CONFIG), pytest.MonkeyPatch.context() as mp:
        mp.setattr(remote, "make_server", never)
        assert main(["dashboard", "--scheduler", "tls://127.0.0.1:1", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("daskpri: error: daskpri dashboard takes a tls:// scheduler's "
                          "credentials from Dask's config only (it has no --tls-* options)")
    assert err.count("\n") == 1
