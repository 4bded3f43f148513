"""One accelerator per worker process: the choice, a pure function of the host's workers.

The wiring (what real ``dask worker --nworkers 2`` processes give the
choice) is in ``test_real_cluster.py``, on its cluster; the choice on a host
of two GPUs is in ``test_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from daskpri.replicas.devices import kept_devices, spread_device, spread_kind

#: the nannies of ``dask worker --nworkers 4`` on one host, in no order
NANNIES = ["tcp://10.0.0.5:41005", "tcp://10.0.0.5:9999", "tcp://10.0.0.5:40001",
           "tcp://10.0.0.5:38000"]


@pytest.mark.parametrize("kind", ["cuda", "xpu"])
def test_as_many_worker_processes_as_devices_take_one_each(kind):
    chosen = [spread_device(kind, 4, me, NANNIES) for me in NANNIES]
    # ordered by port as a number: 9999 before 38000, not after 41005
    assert chosen == [f"{kind}:3", f"{kind}:0", f"{kind}:2", f"{kind}:1"]


def test_more_worker_processes_than_devices_share_them_round_the_host():
    chosen = [spread_device("cuda", 3, me, NANNIES) for me in NANNIES]
    assert sorted(chosen) == ["cuda:0", "cuda:0", "cuda:1", "cuda:2"]


def test_the_choice_is_the_same_whatever_order_the_peers_come_in_and_counts_the_worker():
    for me in NANNIES:
        first = spread_device("cuda", 4, me, NANNIES)
        assert spread_device("cuda", 4, me, list(reversed(NANNIES))) == first
        assert spread_device("cuda", 4, me, [n for n in NANNIES if n != me]) == first


def test_one_visible_device_is_every_processs():
    # CUDA_VISIBLE_DEVICES=1 in a process: torch counts 1, numbered cuda:0 there
    assert {spread_device("cuda", 1, me, NANNIES) for me in NANNIES} == {"cuda:0"}


@pytest.mark.parametrize(("kind", "count", "match"), [
    ("cuda:1", 2, r"kind should be one of 'cuda', 'xpu', but got kind='cuda:1'"),
    ("mps", 2, r"kind should be one of 'cuda', 'xpu', but got kind='mps'"),
    ("cuda", 0, r"count should be a positive integer, but got count=0"),
    ("cuda", True, r"count should be a positive integer, but got count=True"),
])
def test_bad_arguments_are_refused_saying_what_is_allowed(kind, count, match):
    with pytest.raises(ValueError, match=match):
        spread_device(kind, count, NANNIES[0], NANNIES)


@pytest.mark.parametrize("requested", ["cuda:1", "xpu:0", "cpu", "mps"])
def test_a_numbered_device_or_the_cpu_is_taken_as_given(requested):
    assert spread_kind(None, requested) is None  # worker_device takes it


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="needs a machine without 2 GPUs")
@pytest.mark.parametrize("requested", [None, "cuda"])
def test_a_process_that_sees_fewer_than_two_gpus_has_none_to_choose(requested):
    assert spread_kind(None, requested) is None


def test_a_process_that_joins_later_takes_the_device_its_live_peers_hold_least():
    stays, left, joiner = "tcp://h:9000", "tcp://h:8999", "tcp://h:10000"
    # 8999 and 9000 chose cuda:0 and cuda:1 by place; 8999 left, and 10000 joined
    held = {left: "cuda:0", stays: "cuda:1"}
    assert spread_device("cuda", 2, joiner, [stays, joiner]) == "cuda:1"  # by place alone
    assert spread_device("cuda", 2, joiner, [stays, joiner], held) == "cuda:0"
    # its own earlier choice (a nanny's restarted worker), or another kind's, counts for none
    assert spread_device("cuda", 2, stays, [stays, joiner], {stays: "cuda:1"}) == "cuda:0"
    assert spread_device("cuda", 2, joiner, [stays, joiner], {stays: "xpu:1"}) == "cuda:1"
    # all held alike: its place's; processes that chose at once by place keep their places
    three = ["tcp://h:1", "tcp://h:2", "tcp://h:3"]
    by_place = {p: spread_device("cuda", 3, p, three) for p in three}
    assert {p: spread_device("cuda", 3, p, three, by_place) for p in three} == by_place
    assert spread_device("cuda", 2, three[2], three, {three[0]: "cuda:0",
                                                      three[1]: "cuda:1"}) == "cuda:0"


def test_the_records_kept_are_the_live_processes_and_the_choosers():
    h1, h2, h3, g1 = "tcp://h:1", "tcp://h:2", "tcp://h:3", "tcp://g:1"
    held = {"h": {h1: "cuda:0", h2: "cuda:1", h3: "cuda:0"}, "g": {g1: "cuda:1"},
            "gone": {"tcp://gone:1": "cuda:0"}}
    # h:1 left; h:3 restarted under its nanny (a new choice); g's stays; none of gone's is left
    live = {"h": [h2, h3], "g": [g1]}
    assert kept_devices(held, live, "h", h3, "cuda:1") == {
        "h": {h2: "cuda:1", h3: "cuda:1"}, "g": {g1: "cuda:1"}}
    # one that joined a host of none kept; a host none of whose records is live goes
    assert kept_devices(held, {"h": [h2], "k": ["tcp://k:1"]}, "k", "tcp://k:1", "cuda:0") == {
        "h": {h2: "cuda:1"}, "k": {"tcp://k:1": "cuda:0"}}
    assert kept_devices(None, {}, "h", h1, "cuda:0") == {"h": {h1: "cuda:0"}}
    assert held["h"] == {h1: "cuda:0", h2: "cuda:1", h3: "cuda:0"}  # not changed in place
