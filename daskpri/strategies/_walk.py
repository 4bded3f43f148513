"""A worker slot's walk over its samples, kept in the strategy's state.

Shuffled passes (epochs) as mini-batch SGD draws them, taken a step or a
round at a time, with the round marks that put the rounds in flight last in
the next pass, and a round-robin pointer in index order. Pure functions of
a :class:`~daskpri.strategies.selection.SelectContext`: its groups, its
random generator and its ``state``.
"""

from __future__ import annotations

import numpy as np

from daskpri.strategies.selection import _EMPTY, SelectContext


def epoch_batches(ctx: SelectContext, slot: int, size: int) -> np.ndarray:
    """The next ``size`` samples of ``slot`` in a shuffled pass over its data.

    Each slot walks a permutation of its samples (a new one each epoch), as
    mini-batch SGD does; the permutation is strategy state, so a resumed run
    continues it.
    """
    perm = _walk(ctx, slot)  # begun even for a draw of none, as the random stream expects
    group = ctx.groups[slot]
    take = min(size, group.size)
    pos = ctx.state["pos"]
    if 0 < take <= perm.size - pos[slot]:  # within the pass: most steps, one slice
        start = pos[slot]
        pos[slot] = start + take
        batch = group[perm[start : start + take]]
        batch.sort()
        return batch
    out = []
    while take > 0:  # across the end of a pass into the next
        out.append(walk_next(ctx, slot, take))
        take -= out[-1].size
    return np.sort(np.concatenate(out)) if out else _EMPTY


def epoch_rounds(ctx: SelectContext, size: int, count: int) -> list[np.ndarray] | None:
    """:func:`epoch_batches` for ``count`` steps of every slot at once, or None.

    One ``(count, size)`` array per slot (rows sorted), the steps'
    :func:`epoch_batches` in order, drawn from the same random stream: a
    slot's new permutations are drawn in the order the steps would draw
    them (by step, then slot). ``None`` where a step would take fewer than
    ``size`` (a slot smaller than a batch) or a slot's walk is not under way
    (its first pass, or its samples changed): then step by step.
    """
    perms = ctx.state.get("perm", {})
    pos = ctx.state.get("pos", {})
    total = size * count
    events = []  # (step, slot): where a slot's walk begins a pass
    for slot, group in enumerate(ctx.groups):
        perm = perms.get(slot)
        if size < 1 or group.size < size or perm is None or perm.size != group.size:
            return None
        # offsets into the round's draws of the slot where a pass begins
        starts = np.arange(perm.size - pos[slot], total, group.size)
        events += [(int(o) // size, slot) for o in starts]
    fresh: dict[int, list[np.ndarray]] = {slot: [] for slot in range(len(ctx.groups))}
    epochs = ctx.state.setdefault("epochs", {})
    for _, slot in sorted(events):
        fresh[slot].append(ctx.rng.permutation(ctx.groups[slot].size))
        epochs[slot] = epochs.get(slot, 0) + 1
    out = []
    for slot, group in enumerate(ctx.groups):
        perm, start = perms[slot], pos[slot]
        walk = np.concatenate([perm[start:], *fresh[slot]])[:total]
        if fresh[slot]:
            perms[slot] = fresh[slot][-1]
            pos[slot] = total - (perm.size - start) - (len(fresh[slot]) - 1) * group.size
        else:
            pos[slot] = start + total
        batches = group[walk].reshape(count, size)
        batches.sort(axis=1)
        out.append(batches)
    return out


def walk_next(ctx: SelectContext, slot: int, size: int) -> np.ndarray:
    """Up to ``size`` next samples of ``slot``'s walk, in walk order, within one pass.

    Fewer where the current pass ends (the next call begins a new one);
    :func:`walk_back` returns unused ones to the walk.
    """
    perm = _walk(ctx, slot)
    pos = ctx.state["pos"]
    n = max(0, min(size, perm.size - pos[slot]))
    pos[slot] += n
    return ctx.groups[slot][perm[pos[slot] - n : pos[slot]]]


def walk_back(ctx: SelectContext, slot: int, n: int) -> None:
    """Return the last ``n`` samples that :func:`walk_next` gave ``slot`` to its walk."""
    ctx.state["pos"][slot] -= n


def walk_epoch(ctx: SelectContext, slot: int) -> int:
    """The epoch (from 0) of :func:`epoch_batches`'s walk that ``slot``'s next draw starts in."""
    _walk(ctx, slot)
    return int(ctx.state.get("epochs", {}).get(slot, 0))


def mark_round(ctx: SelectContext) -> None:
    """Note where each slot's walk stands as a round begins, for its next pass.

    Once a strategy marks its rounds (from :meth:`Strategy.begin_round`),
    a new pass of a slot's walk draws last the samples that the last two
    rounds drew from the pass before: the round in flight while the next
    is selected ahead, and the round being selected. Each part is shuffled
    on its own and every sample is still drawn once a pass; the next
    rounds' candidates then hold none of the round in flight's samples
    (unless a round draws more than half a pass), so a strategy
    that reads their priorities (:meth:`SelectContext.check_ahead`) can
    select ahead rather than wait for them. Marks are strategy state: a
    resumed run, and a round taken back and selected again, walk the same.

    Examples
    --------
    >>> from daskpri.table.table import PriorityTable
    >>> ctx = SelectContext.local(PriorityTable([8]), batch_size=2)
    >>> mark_round(ctx); first = walk_next(ctx, 0, 4)   # a round draws half the pass
    >>> mark_round(ctx); last = walk_next(ctx, 0, 4)    # the next round ends the pass
    >>> mark_round(ctx)                                  # and a third begins the next pass
    >>> new = np.concatenate([walk_next(ctx, 0, 4), walk_next(ctx, 0, 4)])
    >>> sorted(new[4:].tolist()) == sorted(last.tolist())  # the round in flight's come last
    True
    """
    perms = ctx.state.get("perm", {})
    marks = ctx.state.setdefault("round_marks", {})
    for slot in range(len(ctx.groups)):
        if perms.get(slot) is None:
            continue
        here = np.array([[ctx.state.get("epochs", {}).get(slot, 0), ctx.state["pos"][slot]]])
        before = marks.get(slot, np.empty((0, 2), dtype=np.int64))
        marks[slot] = np.concatenate([before[-1:], here]).astype(np.int64)


def _new_pass(ctx: SelectContext, slot: int, perm: np.ndarray | None) -> np.ndarray:
    """The permutation of ``slot``'s next pass after ``perm`` (see :func:`mark_round`)."""
    size = ctx.groups[slot].size
    marks = ctx.state.get("round_marks", {}).get(slot)
    if perm is None or perm.size != size or marks is None:
        return ctx.rng.permutation(size)
    epoch = ctx.state.get("epochs", {}).get(slot, 0)
    cuts = sorted({int(p) for e, p in marks if e == epoch and 0 < p < size})
    bounds = [0, *cuts, size]
    # each part of the spent pass shuffled on its own, the most recently drawn last
    return np.concatenate(
        [perm[a:b][ctx.rng.permutation(b - a)] for a, b in zip(bounds, bounds[1:], strict=False)]
    )


def _walk(ctx: SelectContext, slot: int) -> np.ndarray:
    """``slot``'s permutation, a new one begun (and counted) where the last is spent.

    A slot whose samples changed (a worker lost or added) begins a new pass
    too. Where the strategy marks its rounds, see :func:`mark_round`.
    """
    group = ctx.groups[slot]
    perms = ctx.state.setdefault("perm", {})
    pos = ctx.state.setdefault("pos", {})
    perm = perms.get(slot)
    if perm is None or perm.size != group.size or (group.size and pos[slot] >= perm.size):
        new = _new_pass(ctx, slot, perm)
        if perm is not None:
            epochs = ctx.state.setdefault("epochs", {})
            epochs[slot] = epochs.get(slot, 0) + 1
        perm = new
        perms[slot], pos[slot] = perm, 0
    return perm


def round_robin(ctx: SelectContext, slot: int, size: int) -> np.ndarray:
    """The next ``size`` samples of ``slot`` in index order, wrapping around."""
    group = ctx.groups[slot]
    if size <= 0 or group.size == 0:
        return _EMPTY
    ptr = ctx.state.setdefault("renew", {})
    start = ptr.get(slot, 0) % group.size
    take = np.arange(start, start + min(size, group.size)) % group.size
    ptr[slot] = (start + size) % group.size
    return np.sort(group[take])
