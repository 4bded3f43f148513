"""Servers bind to loopback; TLS clusters train and refuse plain TCP."""

from __future__ import annotations

import psutil
import pytest
from distributed import Client

import daskpri
from daskpri.models import build_model


def _listening_hosts(pid: int) -> set[str]:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    hosts = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        hosts |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
    return hosts


def test_trainers_own_cluster_listens_on_loopback_only(small_data):
    import os

    train, _ = small_data
    with daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1) as trainer:
        trainer.fit(train, max_steps=2, progress=False)
        assert trainer.client.scheduler.address.startswith("tcp://127.0.0.1:")
        assert trainer.client.dashboard_link.startswith("http://127.0.0.1:")
        hosts = _listening_hosts(os.getpid())
        assert hosts and hosts <= {"127.0.0.1"}, hosts


def test_training_on_a_tls_cluster_and_plain_tcp_is_refused(small_data):
    train, _ = small_data
    with daskpri.Trainer(build_model("mlp", train), strategy="loss", n_workers=1,
                         security=True) as trainer:
        h = trainer.fit(train, max_steps=3, progress=False)
        assert h.sizes["step"] == 3
        address = trainer.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        plain = address.replace("tls://", "tcp://")
        with pytest.raises((OSError, TimeoutError)):
            Client(plain, timeout=3)


def test_security_with_a_client_is_refused(small_data, gpu_client):
    with pytest.raises(ValueError, match="security= applies to the LocalCluster"):
        daskpri.Trainer(build_model("mlp", small_data[0]), client=gpu_client, security=True)
