"""Which pods a held gang's pod slots stand for: as many as can each have a slot of their own.

A held gang's hold stands for the pods it asks; the pods of it already on cards are left
out of the inventory in their place, one pod slot each, a pod only into a slot no smaller
in any dimension (distinct cards, MiB and cores on one card). Matched greedily (placed
pods first, the largest into the smallest slot it fits), a pod could take the slot the
next one alone fits while another slot would have held it: with slots of (1 card, 10,000
MiB, 50 cores) and (1, 20,000, 0), a pod of (1, 10,000, 0) took the first and one of
(1, 5,000, 30) fitted nowhere, so its cards were counted beside the hold that already
held them (issue 27, hostile pass 41).

``matched`` is Kuhn's augmenting paths over slot kinds and their counts (Kueue allows 8
podSets), the sizes grouped by the kinds they fit: each size in turn takes a free slot it
fits, or one whose holder moves to another slot it fits, recursively. 10,000 pods of
distinct sizes on 10,000 slots take 30 ms (the greedy match took 14 s). A size once matched
stays matched as later ones move it, so where not every size fits, the earlier ones are
those kept (placed pods before the rest), and no other choice matches more. Pure.

Example: kinds (1, 10000, 50) x1 and (1, 20000, 0) x1; sizes (1, 10000, 0) then
(1, 5000, 30). The first takes (1, 10000, 50); the second fits only that kind, so the
first moves to (1, 20000, 0): both matched, ``matched(...) == [0, 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence

Size = tuple[int, int, int]
"""(distinct cards, MiB on one card, cores on one card)."""


def fits(size: Size, slot: Size) -> bool:
    """Whether ``size`` is no larger than ``slot`` in any dimension."""
    return all(a <= b for a, b in zip(size, slot, strict=True))


def matched(sizes: Sequence[Size], slots: Sequence[Size]) -> list[int]:
    """The indices of ``sizes`` given a slot of their own, as many as can be, earlier first.

    Args:
        sizes: what each pod holds, in the order they claim a slot.
        slots: one entry per pod slot (repeated for a podSet's count).
    """
    kinds = sorted(set(slots))
    free = [0] * len(kinds)
    index = {kind: k for k, kind in enumerate(kinds)}
    for slot in slots:
        free[index[slot]] += 1
    # Sizes that fit the same kinds are interchangeable: grouped by those kinds, there
    # are at most 2^kinds groups whatever the sizes (10,000 distinct ones took seconds).
    groups: dict[tuple[int, ...], int] = {}
    fit_kinds: list[tuple[int, ...]] = []
    held: list[list[int]] = []
    """held[g][k]: sizes of group g matched to kind k."""

    def place(g: int, seen: set[int]) -> bool:
        for k in fit_kinds[g]:
            if k in seen:
                continue
            seen.add(k)
            if free[k]:
                free[k] -= 1
                held[g][k] += 1
                return True
            for other, on in enumerate(held):
                if on[k] and place(other, seen):
                    on[k] -= 1  # ``other`` moved to a kind ``place`` found it
                    held[g][k] += 1
                    return True
        return False

    out: list[int] = []
    fit_of: dict[Size, int] = {}
    for i, size in enumerate(sizes):
        g = fit_of.get(size)
        if g is None:
            where = tuple(k for k, kind in enumerate(kinds) if fits(size, kind))
            g = fit_of[size] = groups.setdefault(where, len(groups))
            if g == len(fit_kinds):
                fit_kinds.append(where)
                held.append([0] * len(kinds))
        if place(g, set()):
            out.append(i)
    return out
