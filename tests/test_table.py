"""The priority table's own operations, without a cluster."""

from __future__ import annotations

import re

import numpy as np
import pytest

from daskpri.table.table import PriorityTable


def test_offsets_and_partition_lookup():
    t = PriorityTable([3, 2, 4])
    assert t.n_samples == 9 and t.n_partitions == 3
    assert t.partition_of(np.array([0, 2, 3, 4, 5, 8])).tolist() == [0, 0, 1, 1, 2, 2]
    assert t.indices_of([2, 0]).tolist() == [5, 6, 7, 8, 0, 1, 2]
    assert t.indices_of([]).size == 0


def test_unseen_samples_have_infinite_estimate_and_nan_priority():
    t = PriorityTable([4])
    t.update(np.array([1]), np.array([0.3]), step=0)
    assert np.isinf(t.estimate(0)[[0, 2, 3]]).all()
    assert np.isnan(t.priority[[0, 2, 3]]).all()
    assert t.priority[1] == pytest.approx(0.3)
    assert t.version.tolist() == [-1, 0, -1, -1]


def test_update_keeps_history_newest_first():
    t = PriorityTable([2])
    for step, v in enumerate([1.0, 2.0, 3.0, 4.0]):
        t.update(np.array([0]), np.array([v]), step=step)
    p, s = t.observations(np.array([0]))
    assert p[0].tolist() == [4.0, 3.0, 2.0]
    assert s[0].tolist() == [3, 2, 1]


@pytest.mark.parametrize(
    "indices, values, match",
    [
        (np.array([0, 1]), np.array([0.1, np.nan]), "priorities should be finite.*sample 1"),
        (np.array([0]), np.array([np.inf]), "priorities should be finite"),
        (np.array([0, 9]), np.array([0.1, 0.2]), r"indices should lie in \[0, 5\), but got 9"),
        (np.array([-1]), np.array([0.1]), r"indices should lie in \[0, 5\), but got -1"),
        (np.array([0, 1]), np.array([0.1]), "one length"),
    ],
)
def test_bad_updates_are_refused_and_leave_the_table_unchanged(indices, values, match):
    t = PriorityTable([5])
    t.update(np.array([0, 1]), np.array([0.5, 0.6]), step=0)
    before = t.state_dict()
    with pytest.raises(ValueError, match=match):
        t.update(indices, values, step=1)
    after = t.state_dict()
    for k in ("current", "version", "older_p", "older_t"):
        np.testing.assert_array_equal(before[k], after[k])


def test_float_indices_are_a_type_error():
    with pytest.raises(TypeError, match="indices should be integers"):
        PriorityTable([3]).update(np.array([0.0]), np.array([1.0]), step=0)


def test_negative_priorities_are_allowed():
    t = PriorityTable([2])
    t.update(np.array([0, 1]), np.array([-2.0, -1.0]), step=0)
    assert t.topk(1, np.array([0, 1]), step=0).tolist() == [1]


@pytest.mark.parametrize("sizes", [[3, 0, 2], [], [[1, 2]], [1.5]])
def test_bad_partition_sizes(sizes):
    with pytest.raises(ValueError, match="partition"):
        PriorityTable(sizes)


def test_topk_picks_the_largest_exactly():
    t = PriorityTable([4, 4])
    values = np.array([0.1, 0.9, 0.5, 0.3, 0.8, 0.2, 0.7, 0.6])
    t.update(np.arange(8), values, step=0)
    assert t.topk(3, np.arange(8), step=0).tolist() == [1, 4, 6]
    assert t.topk(3, slice(0, 8), step=0).tolist() == [1, 4, 6]
    # among a subset, and with exclusions
    assert t.topk(2, np.array([0, 2, 3, 5]), step=0).tolist() == [2, 3]
    assert t.topk(2, slice(0, 8), step=0, exclude=np.array([1, 4])).tolist() == [6, 7]
    assert t.topk(10, np.array([3, 1]), step=0).tolist() == [1, 3]


def test_topk_ranks_unseen_first_and_draws_among_them_with_the_rng():
    t = PriorityTable([100])
    t.update(np.arange(50), np.full(50, 100.0), step=0)
    picks = t.topk(10, slice(0, 100), step=0, rng=np.random.default_rng(1))
    assert (picks >= 50).all() and picks.size == 10
    again = t.topk(10, slice(0, 100), step=0, rng=np.random.default_rng(1))
    other = t.topk(10, slice(0, 100), step=0, rng=np.random.default_rng(2))
    assert picks.tolist() == again.tolist() and picks.tolist() != other.tolist()
    # fewer unseen than k: all unseen plus the best seen
    t.update(np.arange(50, 95), np.zeros(45), step=1)
    top = t.topk(7, slice(0, 100), step=1)
    assert set(range(95, 100)) <= set(top.tolist())


def test_summaries_per_partition():
    t = PriorityTable([2, 3], n_bins=4)
    t.update(np.array([0, 1, 2]), np.array([1.0, 3.0, 2.0]), step=2)
    s = t.summaries(step=5)
    assert s["sum"].tolist() == [4.0, 2.0]
    assert s["max"].tolist() == [3.0, 2.0]
    assert s["count"].tolist() == [2, 3]
    assert s["seen"].tolist() == [2, 1]
    assert s["staleness"].tolist() == [3.0, 3.0]
    assert s["histogram"].shape == (2, 4) and s["histogram"].sum() == 3
    assert s["bin_edges"][0] == 1.0 and s["bin_edges"][-1] == 3.0


def test_state_dict_round_trip_and_mismatch():
    t = PriorityTable([3, 3], staleness="exp-linear")
    t.update(np.array([0, 4]), np.array([0.5, 0.25]), step=3)
    u = PriorityTable.from_state_dict(t.state_dict())
    np.testing.assert_array_equal(u.priority, t.priority)
    assert u.staleness == "exp-linear" and u.n_updates == 2
    with pytest.raises(ValueError, match="partitions do not match"):
        PriorityTable([6]).load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match=r"2 partitions of 6 samples in the state, 2 of 6 here, "
                       r"cut at 3 there and 2 here$"):
        PriorityTable([2, 4]).load_state_dict(t.state_dict())


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("n_bins", "many",
         "the state's n_bins should be a positive integer, but got n_bins='many'"),
        ("n_bins", 0, "the state's n_bins should be a positive integer, but got n_bins=0"),
        ("n_updates", None, "the state's n_updates should be an integer of at least 0, but got "
                            "n_updates=None"),
    ],
)
def test_a_refused_state_leaves_the_table_as_it_was(key, value, message):
    state = PriorityTable([3, 3], staleness="exp-linear", n_bins=4)
    state.update(np.array([0, 4]), np.array([0.5, 0.25]), step=3)
    bad = {**state.state_dict(), key: value}
    t = PriorityTable([3, 3])
    t.update(np.array([1]), np.array([2.0]), step=0)
    before = {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in t.state_dict().items()}
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        t.load_state_dict(bad)
    after = t.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        np.testing.assert_array_equal(after[k], v, err_msg=k)


def test_forget_makes_samples_unseen():
    t = PriorityTable([3])
    t.update(np.arange(3), np.ones(3), step=0)
    t.forget(np.array([1]))
    assert np.isinf(t.estimate(1)[1]) and t.version[1] == -1


def test_a_round_of_selections_travels_packed_and_arrives_equal():
    import msgpack

    from daskpri.strategies.base import Selection
    from daskpri.table._packing import _pack_round, _unpack_round

    steps = [
        Selection(train=np.array([3, 1, 2])),
        Selection(train=np.array([5, 4]), weights=np.array([0.5, 2.0]), score=np.array([7])),
        Selection(train=np.array([], dtype=np.int64), extra={"stale": np.empty(0)}),
        Selection(train=np.array([9]), weights=np.array([1.5]),
                  extra={"ref": np.arange(3.0), "batch_size": np.asarray(64)}),
    ]
    # through msgpack, as the scheduler's RPC sends it
    wire = msgpack.unpackb(msgpack.packb(_pack_round(steps), use_bin_type=True))
    got = _unpack_round(wire)
    assert len(got) == len(steps)
    for g, s in zip(got, steps, strict=True):
        assert g.train.tolist() == s.train.tolist() and g.train.dtype == np.int64
        assert g.score.tolist() == s.score.tolist()
        if s.weights is None:
            assert g.weights is None
        else:
            assert g.weights.tolist() == s.weights.tolist() and g.weights.dtype == np.float64
        assert g.extra.keys() == s.extra.keys()
        for key in s.extra:
            assert np.array_equal(g.extra[key], s.extra[key])
            assert g.extra[key].shape == s.extra[key].shape  # a 0-d array stays 0-d
    assert _unpack_round(_pack_round([])) == []

    # a round without extras sends none, and each step unpacks with a dict of its own
    plain = [Selection(train=np.array([i, i + 1])) for i in range(3)]
    wire = msgpack.unpackb(msgpack.packb(_pack_round(plain), use_bin_type=True))
    assert wire["extra"] == []
    got = _unpack_round(wire)
    assert [g.train.tolist() for g in got] == [[0, 1], [1, 2], [2, 3]]
    assert all(g.extra == {} and g.weights is None for g in got)
    got[0].extra["x"] = 1
    assert got[1].extra == {}
