"""The capacity manager: how much of one accelerator pool training may hold, and what to take back.

Pure: one pool's figures and ``now`` in, a ``PoolPlan`` with its reason out. The admission
controller (``admission/controller.py``) enforces it in serving; the joint replay
(``replay/pool``) runs the very same function over a simulated pool.

It combines the inference scalers' forecast (``PoolDemand``: what inference holds and the
most it is forecast to need within the horizon, headroom included), the training side
(each admitted workload's cards, priority, admission time, preemptibility) and the pool's
inventory (cards, and how much of each card is taken). Its answer:

- **allowance**: the cards training may hold now, ``cards - inference needed - headroom``
  (``ManagerPolicy``'s headroom for bursts, none by default); the admission check refuses a
  gang that would take training past it;
- **reclaim**: when inference needs whole cards the pool has no longer free, the admitted
  training workloads to evict (through Kueue: our check set to ``Retry``), lowest priority
  first, then most recently admitted, skipping any not preemptible or running for less than
  ``min_run_seconds``, and only those that free a whole card, until the shortfall is covered.
  The shortfall is the real one: the headroom is never reclaimed for.

What inference holds is the larger of the scalers' count (serving replicas) and, when
known, the inventory's (``PoolState.inference_cards``: a replica still starting holds its
card too); the reason says which.

A missing signal is never a zero: without the forecast the plan has no allowance and
reclaims nothing (``PoolPlan.known`` is False), and says why.

A workload that frees no whole card by itself (a fractional share on a card someone else
also holds) is held aside, not evicted; it is taken only when a later candidate frees a
card together with it. So two preemptible halves of one card are reclaimed together, and
a half sharing its card with work that is not reclaimable is never evicted for nothing.

Unit cost orders nothing directly: the order is priority, then the most recent admission,
which among equal priority is the victim that loses the fewest accelerator-hours of work
(cards x time run) as long as gangs are of similar size. Inference's cost per million
tokens and the accelerator-hours the reclaims lose are reported, for the metrics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

__all__ = [
    "Admitted",
    "InferenceNeed",
    "ManagerPolicy",
    "PoolPlan",
    "PoolState",
    "Reclaim",
    "plan_pool",
    "within_allowance",
]

SHARE_TOLERANCE: Final = 1e-6
"""A card whose share left after evictions is within this of 0 is whole again (the
shares are float sums, ``0.3 + 0.7`` is not exactly 1)."""
CARD_TOLERANCE: Final = 1e-9
"""A forecast within this above a whole number is that number (5.0000000001 needs 5
cards, not 6): the same rounding as the headroom check in ``admission.decide``."""


@dataclass(frozen=True, slots=True)
class InferenceNeed:
    """What the scalers say of one pool (``GetInferenceDemand``), both figures known."""

    held: float
    """Accelerators inference replicas hold now."""
    needed: float
    """The most inference is forecast to need within the horizon (headroom included)."""
    cost_per_million_tokens: float | None = None
    """Inference's unit cost now, for the reason and the metrics; None: unknown."""


@dataclass(frozen=True, slots=True)
class PoolState:
    """One pool's cards and what is taken of each."""

    cards: int
    """Every card of the pool that takes work (healthy, not cordoned)."""
    taken: Mapping[str, float]
    """Per card id (``<node>/<uuid>``), the share of it taken by anyone (0 < share <= 1);
    a card absent is whole and free. Only cards counted in ``cards`` belong here."""
    pool: str = ""
    """The pool's name, for the messages (``""``: left out of them)."""
    inference_cards: float | None = None
    """Cards the inventory shows inference pods holding (a replica still starting holds
    its card, though the scalers count only serving ones); None: unknown."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """One admitted training workload on the pool."""

    key: str
    """``namespace/name`` of the Workload."""
    priority: int
    admitted_at: float
    """Unix seconds Kueue admitted it (its ``Admitted`` condition's transition)."""
    preemptible: bool
    shares: Mapping[str, float]
    """Per card id, the share of that card its pods hold."""

    @property
    def cards(self) -> float:
        """The cards' worth it holds (fractional shares summed)."""
        return math.fsum(self.shares.values())


@dataclass(frozen=True, slots=True)
class ManagerPolicy:
    """The SRE's knobs (``CapacityCheckParameters.spec.reclaim``)."""

    reclaim: bool = True
    """False: publish the allowance, take nothing back."""
    min_run_seconds: float = 600.0
    """A workload admitted less than this long ago is never reclaimed (no thrashing)."""
    headroom_fraction: float = 0.0
    """The allowance keeps this share of inference's forecast more free, so a burst beyond
    the forecast finds whole cards instead of waiting for a reclaim (and its minimum run)."""
    headroom_cards: int = 0
    """Whole cards the allowance keeps free on top of that, for the same reason."""


@dataclass(frozen=True, slots=True)
class Reclaim:
    """One workload to evict, and why."""

    key: str
    message: str
    """What our check's ``Retry`` message says (Kueue shows it on the Workload)."""
    cards_freed: int
    """Whole cards its eviction frees, on top of the reclaims listed before it."""
    accelerator_hours_lost: float
    """Cards it holds times how long it has run: the work at stake if it keeps no checkpoint."""


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """The manager's answer for one pool at one instant."""

    known: bool
    """False: the forecast is missing; nothing below is enforced."""
    allowance: float | None
    """Cards training may hold now; None when not known."""
    training_held: float
    free_cards: int
    """Whole cards nothing holds."""
    shortfall: int
    """Whole cards inference needs beyond what it holds and what is free."""
    reclaim: tuple[Reclaim, ...]
    reason: str
    pool: str = ""
    cards: int = 0
    """The pool's cards (``PoolState.cards``)."""
    needed_cards: int | None = None
    """Whole cards inference is forecast to need; None when not known."""
    headroom_cards: int = 0
    """Whole cards the allowance keeps free beyond ``needed_cards`` (the policy's headroom)."""
    uncovered: int = 0
    """Whole cards of the shortfall the reclaims do not cover."""
    reclaimed_accelerator_hours: float = 0.0
    """The accelerator-hours of work the reclaims lose (sum of ``accelerator_hours_lost``)."""
    cost_per_million_tokens: float | None = None
    """Inference's unit cost now (``InferenceNeed``'s), for the metrics; None: unknown."""


def plan_pool(
    state: PoolState,
    need: InferenceNeed | None,
    admitted: Sequence[Admitted],
    now: float,
    policy: ManagerPolicy,
    missing: str = "",
) -> PoolPlan:
    """The allowance and the reclaims for one pool at ``now``.

    ``need`` None means the forecast is unavailable (``missing`` says why): the plan is
    not known, reclaims nothing, and says so.

    Raises:
        ValueError: a figure out of range (a share outside (0, 1], a negative count or
            forecast, a time not finite) or two admitted workloads with one key.
    """
    _check_inputs(state, need, admitted, now, policy)
    free = max(0, state.cards - len(state.taken))
    held = math.fsum(a.cards for a in admitted)
    if need is None:
        why = missing.strip() or "no reason given"
        return PoolPlan(
            known=False,
            allowance=None,
            training_held=held,
            free_cards=free,
            shortfall=0,
            reclaim=(),
            reason=f"{_pool_label(state.pool)}: the inference forecast is missing ({why}): "
            "no allowance, nothing reclaimed",
            pool=state.pool,
            cards=state.cards,
        )
    held_by_inference, held_from = _inference_held(need, state.inference_cards)
    needed_cards = _whole(need.needed)
    headroom = _headroom(need.needed, needed_cards, policy)
    more = _whole(need.needed - held_by_inference)
    shortfall = max(0, more - free)
    figures = _Figures(state.pool, more, need.needed, held_by_inference, free, held_from)
    groups: list[_Group] = []
    if shortfall and policy.reclaim:
        groups = _choose(state.taken, _candidates(admitted, now, policy), shortfall)
    reclaims = tuple(_reclaims(groups, figures, now))
    freed = sum(r.cards_freed for r in reclaims)
    plan = PoolPlan(
        known=True,
        allowance=max(0, state.cards - needed_cards - headroom),
        training_held=held,
        free_cards=free,
        shortfall=shortfall,
        reclaim=reclaims,
        reason="",
        pool=state.pool,
        cards=state.cards,
        needed_cards=needed_cards,
        headroom_cards=headroom,
        uncovered=max(0, shortfall - freed) if policy.reclaim else shortfall,
        reclaimed_accelerator_hours=math.fsum(r.accelerator_hours_lost for r in reclaims),
        cost_per_million_tokens=need.cost_per_million_tokens,
    )
    short = _uncovered_why(plan, admitted, now, policy)
    return _with_reason(plan, need, figures, short, reclaim_on=policy.reclaim)


def _headroom(needed: float, needed_cards: int, policy: ManagerPolicy) -> int:
    """Whole cards kept free beyond the forecast: ``ceil(needed * (1 + f)) + cards - ceil(needed)``.

    Only the allowance keeps them; reclaim acts on the real shortfall alone, since evicting
    running training for a burst that may never come loses its work for certain.
    """
    padded = _whole(needed * (1.0 + policy.headroom_fraction))
    return padded - needed_cards + policy.headroom_cards


def within_allowance(plan: PoolPlan, gang_cards: float) -> tuple[bool, str]:
    """Whether admitting a gang of ``gang_cards`` keeps training within the allowance, and why.

    An unknown plan admits (the headroom check, when configured, says whether to hold).

    Raises:
        ValueError: ``gang_cards`` negative or not finite.
    """
    if not math.isfinite(gang_cards) or gang_cards < 0:
        raise ValueError(f"gang_cards must be a finite number >= 0, got {gang_cards!r}")
    if not plan.known or plan.allowance is None:
        return True, f"no allowance known: {plan.reason}"
    after = plan.training_held + gang_cards
    where = f"on pool {plan.pool} " if plan.pool else ""
    kept = f", {plan.headroom_cards} more kept for bursts" if plan.headroom_cards else ""
    context = (
        f"{where}(inference forecast to need {plan.needed_cards} of {plan.cards}{kept})"
        if plan.needed_cards is not None
        else where.strip()
    )
    gpus = _gpus(gang_cards)
    if after <= plan.allowance + CARD_TOLERANCE:
        return True, (
            f"admitting {gpus} keeps training at {after:g} of its {plan.allowance:g}-GPU "
            f"allowance {context}"
        ).strip()
    return False, (
        f"admitting {gpus} would take training to {after:g} of its {plan.allowance:g}-GPU "
        f"allowance {context}"
    ).strip()


@dataclass(frozen=True, slots=True)
class _Figures:
    """What every reclaim message repeats."""

    pool: str
    more: int
    needed: float
    held: float
    free: int
    held_from: str = ""
    """Where ``held`` came from, when the inventory is known (for the reason)."""


@dataclass(frozen=True, slots=True)
class _Group:
    """Workloads evicted together, and the whole cards they free beyond the groups before."""

    members: tuple[Admitted, ...]
    cards_freed: int


def _inference_held(need: InferenceNeed, inventory: float | None) -> tuple[float, str]:
    """What inference holds: the larger of the scalers' count and the inventory's, and which.

    The scalers count serving replicas; one still starting already holds its card, and
    counting that card as missing would reclaim one inference already has (training then
    takes the freed card back, and the next plan reclaims again).
    """
    if inventory is None:
        return need.held, ""
    if inventory > need.held:
        return inventory, f"the inventory's cards; the scalers count {need.held:g} serving"
    return need.held, f"the scalers' count; the inventory shows {inventory:g}"


def _candidates(admitted: Sequence[Admitted], now: float, policy: ManagerPolicy) -> list[Admitted]:
    """Reclaimable workloads in the order they are taken: lowest priority, newest, key."""
    ready = [a for a in admitted if a.preemptible and _old_enough(a, now, policy)]
    return sorted(ready, key=lambda a: (a.priority, -a.admitted_at, a.key))


def _old_enough(workload: Admitted, now: float, policy: ManagerPolicy) -> bool:
    return now - workload.admitted_at >= policy.min_run_seconds


def _choose(
    taken: Mapping[str, float], candidates: Sequence[Admitted], shortfall: int
) -> list[_Group]:
    """The groups to evict, in order, until they free ``shortfall`` whole cards.

    A candidate that frees nothing more waits aside; when a later one frees cards, those
    aside that hold a share of a newly freed card go with it (they were needed for it).
    Invariant: the cards freed by the chosen and those aside together are those freed by
    the chosen alone, so when the loop runs out every freeable card is freed.
    """
    chosen: list[Admitted] = []
    aside: list[Admitted] = []
    groups: list[_Group] = []
    freed: set[str] = set()
    for candidate in candidates:
        if len(freed) >= shortfall:
            break
        gained = _freed(taken, [*chosen, *aside, candidate]) - freed
        if not gained:
            aside.append(candidate)
            continue
        helpers = [a for a in aside if not gained.isdisjoint(a.shares)]
        aside = [a for a in aside if a not in helpers]
        chosen += [*helpers, candidate]
        now_freed = _freed(taken, chosen)
        groups.append(_Group((*helpers, candidate), len(now_freed) - len(freed)))
        freed = now_freed
    return groups


def _freed(taken: Mapping[str, float], evicted: Iterable[Admitted]) -> set[str]:
    """The cards with nothing left on them once ``evicted`` are gone."""
    released: dict[str, list[float]] = {}
    for workload in evicted:
        for card, share in workload.shares.items():
            released.setdefault(card, []).append(share)
    # fsum: exact, so the answer does not hang on the order the shares come in.
    return {
        card
        for card, shares in released.items()
        if card in taken and taken[card] - math.fsum(shares) <= SHARE_TOLERANCE
    }


def _reclaims(groups: Sequence[_Group], figures: _Figures, now: float) -> list[Reclaim]:
    """One Reclaim per member; a group's cards are counted on its last member."""
    reclaims = []
    for group in groups:
        for i, workload in enumerate(group.members):
            last = i == len(group.members) - 1
            others = [m.key for m in group.members if m is not workload]
            run = max(0.0, now - workload.admitted_at)
            reclaims.append(
                Reclaim(
                    key=workload.key,
                    message=_reclaim_message(workload, figures, run, group.cards_freed, others),
                    cards_freed=group.cards_freed if last else 0,
                    accelerator_hours_lost=workload.cards * run / 3600.0,
                )
            )
    return reclaims


def _reclaim_message(
    workload: Admitted, figures: _Figures, run: float, freed: int, others: Sequence[str]
) -> str:
    where = f" on pool {figures.pool}" if figures.pool else ""
    together = f" together with {', '.join(others)}" if others else ""
    return (
        f"reclaimed for inference{where}: it needs {_gpus(figures.more, 'more whole ')} within "
        f"its forecast ({figures.needed:g} needed, {figures.held:g} held, {figures.free} free); "
        f"priority {workload.priority}, admitted {_age(run)} ago; frees {_gpus(freed)}{together}"
    )


def _uncovered_why(
    plan: PoolPlan, admitted: Sequence[Admitted], now: float, policy: ManagerPolicy
) -> str:
    """Why the reclaims fall short of the shortfall (``""`` when they do not)."""
    if not plan.uncovered or not policy.reclaim:
        return ""
    preemptible = [a for a in admitted if a.preemptible]
    young = [a for a in preemptible if not _old_enough(a, now, policy)]
    if not admitted:
        return "no training is admitted on the pool"
    if not preemptible:
        return f"none of the {len(admitted)} admitted training workloads is preemptible"
    if len(young) == len(preemptible):
        return (
            f"all {len(preemptible)} preemptible workloads were admitted less than "
            f"{policy.min_run_seconds:g} s ago"
        )
    freed = plan.shortfall - plan.uncovered
    old = len(preemptible) - len(young)
    why = f"the {old} preemptible workloads old enough free only {_gpus(freed, 'whole ')}"
    spared = old - len(plan.reclaim)
    if spared:
        why += f" ({spared} share their cards with work not reclaimable)"
    if young:
        why += f"; {len(young)} more were admitted less than {policy.min_run_seconds:g} s ago"
    return why


def _with_reason(
    plan: PoolPlan, need: InferenceNeed, figures: _Figures, short: str, *, reclaim_on: bool
) -> PoolPlan:
    """``plan`` with its one-sentence reason, every figure in it."""
    source = f" ({figures.held_from})" if figures.held_from else ""
    kept = f", {plan.headroom_cards} more kept free for bursts" if plan.headroom_cards else ""
    parts = [
        f"{_pool_label(plan.pool)}: inference holds {figures.held:g}{source} and is forecast "
        f"to need {need.needed:g} ({plan.needed_cards} whole) of {plan.cards} GPUs{kept}, so "
        f"training may hold {plan.allowance} (it holds {plan.training_held:g})",
        f"{figures.free} whole GPUs free",
    ]
    if figures.more == 0:
        parts.append("inference needs no more")
    elif plan.shortfall == 0:
        parts.append(f"the {figures.more} more inference needs fit in them: nothing reclaimed")
    else:
        parts.append(f"inference needs {figures.more} more: {plan.shortfall} short")
        parts.append(
            _reclaim_summary(plan, short) if reclaim_on else "reclaim is off: nothing taken back"
        )
    if plan.cost_per_million_tokens is not None:
        parts.append(f"inference costs {plan.cost_per_million_tokens:g} per million tokens")
    return replace(plan, reason="; ".join(parts))


def _reclaim_summary(plan: PoolPlan, short: str) -> str:
    summary = ""
    if plan.reclaim:
        freed = sum(r.cards_freed for r in plan.reclaim)
        keys = ", ".join(r.key for r in plan.reclaim)
        summary = (
            f"reclaiming {len(plan.reclaim)} workload{'s' if len(plan.reclaim) != 1 else ''} "
            f"({keys}) frees {_gpus(freed)}, {plan.reclaimed_accelerator_hours:.2f} "
            "accelerator-hours of work lost"
        )
    if plan.uncovered:
        gap = f"{_gpus(plan.uncovered)} still short: {short}"
        summary = f"{summary}; {gap}" if summary else gap
    return summary


def _check_inputs(
    state: PoolState,
    need: InferenceNeed | None,
    admitted: Sequence[Admitted],
    now: float,
    policy: ManagerPolicy,
) -> None:
    """Raise ValueError naming the first figure out of range."""
    if isinstance(state.cards, bool) or not isinstance(state.cards, int) or state.cards < 0:
        raise ValueError(f"PoolState.cards must be an integer >= 0, got {state.cards!r}")
    for card, share in state.taken.items():
        _check_share(f"PoolState.taken[{card!r}]", share)
    if state.inference_cards is not None:
        _check_count("PoolState.inference_cards", state.inference_cards)
    if need is not None:
        for name in ("held", "needed"):
            _check_count(f"InferenceNeed.{name}", getattr(need, name))
        if need.cost_per_million_tokens is not None:
            _check_count("InferenceNeed.cost_per_million_tokens", need.cost_per_million_tokens)
    seen: set[str] = set()
    for workload in admitted:
        if workload.key in seen:
            raise ValueError(f"two admitted workloads are both {workload.key!r}")
        seen.add(workload.key)
        if not math.isfinite(workload.admitted_at):
            raise ValueError(
                f"{workload.key}: admitted_at must be finite, got {workload.admitted_at!r}"
            )
        for card, share in workload.shares.items():
            _check_share(f"{workload.key}: shares[{card!r}]", share)
    if not math.isfinite(now):
        raise ValueError(f"now must be finite, got {now!r}")
    _check_count("ManagerPolicy.min_run_seconds", policy.min_run_seconds)
    _check_count("ManagerPolicy.headroom_fraction", policy.headroom_fraction)
    cards = policy.headroom_cards
    if isinstance(cards, bool) or not isinstance(cards, int) or cards < 0:
        raise ValueError(f"ManagerPolicy.headroom_cards must be an integer >= 0, got {cards!r}")


def _check_share(what: str, share: float) -> None:
    if not (isinstance(share, (int, float)) and math.isfinite(share)) or not (
        0 < share <= 1 + SHARE_TOLERANCE
    ):
        raise ValueError(f"{what} must be a share of a card in (0, 1], got {share!r}")


def _check_count(what: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")


def _whole(cards: float) -> int:
    """Whole cards covering ``cards`` (never below 0), float noise forgiven."""
    return max(0, math.ceil(cards - CARD_TOLERANCE))


def _gpus(count: float, kind: str = "") -> str:
    return f"{count:g} {kind}GPU{'' if count == 1 else 's'}"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _pool_label(pool: str) -> str:
    return f"pool {pool}" if pool else "the pool"
