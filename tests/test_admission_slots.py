"""A held gang's pod slots stand for as many of its pods as can each have one (issue 27, pass 41).

``admission.slots.matched``: greedy (placed pods first, the largest into the smallest
slot it fits), a pod could take the slot the next one alone fits while another would
have held it, and the next one's cards were counted beside the hold that held them.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission.slots import Size, fits, matched

SHARE = (1, 10_000, 50)
BIG_SHARE = (1, 20_000, 0)


@pytest.mark.parametrize(
    ("sizes", "slots", "expected"),
    [
        pytest.param(
            [(1, 10_000, 0), (1, 5_000, 30)],
            [SHARE, BIG_SHARE],
            [0, 1],
            id="a pod that fits only the slot another took gets it as the other moves",
        ),
        pytest.param(
            [(1, 1, 0)] * 3, [(1, 1, 0)] * 2, [0, 1], id="more pods than slots keep the earlier"
        ),
        pytest.param(
            [(2, 0, 0)], [(1, 80_000, 100)], [], id="a pod wider than every slot is left out"
        ),
        pytest.param(
            [(1, 10_000, 0), (1, 10_000, 0)],
            [BIG_SHARE],
            [0],
            id="a later pod never takes the slot of an earlier one that fits it",
        ),
        pytest.param(
            [(8, 0, 0), (1, 0, 0)],
            [(1, 0, 0)],
            [1],
            id="an earlier pod that fits nothing does not stop a later one",
        ),
        pytest.param(
            [(1, 1, 0), (1, 0, 1), (1, 2, 2)],
            [(1, 1, 1), (1, 2, 2), (1, 2, 0)],
            [0, 1, 2],
            id="moves two deep: each pod takes the slot that frees the next",
        ),
        pytest.param([], [SHARE], [], id="no pods: none matched"),
        pytest.param([SHARE], [], [], id="no slots: none matched"),
    ],
)
def test_as_many_pods_as_can_each_have_a_slot_are_matched_earlier_first(
    sizes: list[Size], slots: list[Size], expected: list[int]
) -> None:
    assert matched(sizes, slots) == expected


def matchable(sizes: list[Size], slots: list[Size]) -> bool:
    """Whether every one of ``sizes`` can have a slot of its own (by trying them all)."""
    return any(
        all(fits(size, slots[s]) for size, s in zip(sizes, chosen, strict=True))
        for chosen in itertools.permutations(range(len(slots)), len(sizes))
    )


small = st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 3))


@given(st.lists(small, max_size=5), st.lists(small, max_size=5))
def test_the_matched_pods_are_the_earliest_first_of_a_largest_matching(
    sizes: list[Size], slots: list[Size]
) -> None:
    """The set is matchable, and no pod left out could join the earlier ones matched
    (so no matching holds more, and none keeps a left-out pod over a later one)."""
    chosen = matched(sizes, slots)
    assert chosen == sorted(set(chosen))
    assert matchable([sizes[i] for i in chosen], slots)
    for left in set(range(len(sizes))) - set(chosen):
        before = [sizes[i] for i in chosen if i < left]
        assert not matchable([*before, sizes[left]], slots)
