"""Built-in workloads: seeded, documented traces from the project's own generator.

``builtin:business-day`` (``BusinessDay``, ``business_day``) is one business day of a
chat service compressed into ``length`` seconds of trace time (an hour by default, so
each hour of the day is 150 s). The rate, in requests per second, is ``base_rate``
times a share that follows the clock of the day, linearly between the knots:

=============  ================================  =====================================
hour of day    share of ``base_rate``             what it exercises
=============  ================================  =====================================
00:00 - 06:00  ``night_share`` (0: idle)           scale to zero, a fleet at zero
06:00 - 09:00  ramps up to 1                       activation, forecast-led scale-up
09:00 - 17:00  1, with short spikes                steady state; spikes shorter than a
               (2x for 15 s at 10:00, 14:30,      cold start, which buffering or
               16:00)                              headroom must absorb
12:00          4x for 120 s (the lunch burst)     scale-up speed against a 38.5 s cold
                                                   start
17:00 - 22:00  declines to ``night_share``        scale-down, its delays
22:00 - 24:00  ``night_share``                     idle again
=============  ================================  =====================================

The burst and the spikes last seconds of trace time, not hours of the day, so a
shorter ``length`` keeps them as long (a 2-minute burst stays 2 minutes). Arrivals are
Poisson (thinning); prompt and output lengths are log-normal with the Azure LLM
conversation trace's medians (1,020 and 129 tokens; sigma 0.9 and 0.85, near its log
spreads of 0.99 and 0.86), clipped to 16-8,192 and 8-1,000 tokens. At the default 80
requests per second about 175,000 requests arrive; the lunch burst needs about 4x the
plateau's replicas within two minutes.

``builtin:business-days`` (three weekdays) and ``builtin:business-week`` (Monday to
Sunday) are such days back to back, each varied (``DayToDay``): its volume scaled by a
log-normal factor (sigma 0.15, about the +-20% day-to-day shifts of ServeGen's production
traffic), its lunch burst and spikes moved by up to an hour, and a weekend day at 30% of
the volume with no burst or spike. Day ``d`` is drawn from its own seed, so a run of
three days shares its first two with a run of two.

``load_trace`` reads a trace source as ``unitscale replay --trace`` takes it: a file
(Azure CSV or Mooncake JSONL), a directory of Azure CSVs as one trace (the gateway's
rotated arrivals, ``replay.trace.read_recording``), ``builtin:NAME``, or ServeGen's
per-client data (``servegen:DIR?scale=X&days=A-B`` or its directory, ``replay.servegen``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from replay.servegen import is_servegen, parse_source, read_servegen
from replay.trace import Trace, TraceError, read_recording, read_trace

BUILTIN_PREFIX = "builtin:"
"""A ``--trace`` starting with this names a generated workload (``BUILTINS``)."""
_DAY_KNOTS = (0.0, 6.0, 9.0, 17.0, 22.0, 24.0)
"""Hours where the day's share changes slope: night, ramp, plateau, decline, night."""


@dataclass(frozen=True, slots=True)
class BusinessDay:
    """The business day's knobs (module docstring); the defaults are ``builtin:business-day``."""

    length: float = 3600.0
    """Seconds of trace time for the 24 hours."""
    base_rate: float = 80.0
    """Requests per second in working hours (09:00 - 17:00)."""
    night_share: float = 0.0
    """The night's rate as a share of ``base_rate`` (0: no traffic)."""
    lunch_hour: float = 12.0
    lunch_multiple: float = 4.0
    lunch_seconds: float = 120.0
    """Seconds of trace time the lunch burst lasts."""
    spike_hours: tuple[float, ...] = (10.0, 14.5, 16.0)
    spike_multiple: float = 2.0
    spike_seconds: float = 15.0
    prompt_median: float = 1020.0
    output_median: float = 129.0
    prompt_sigma: float = 0.9
    output_sigma: float = 0.85
    prompt_range: tuple[int, int] = (16, 8192)
    output_range: tuple[int, int] = (8, 1000)

    def check(self) -> None:
        """Refuse a day that cannot be generated.

        Raises:
            ValueError: naming the field and its value.
        """
        positive = {
            "length": self.length,
            "lunch_multiple": self.lunch_multiple,
            "spike_multiple": self.spike_multiple,
        }
        for key, value in positive.items():
            if not value > 0:
                raise ValueError(f"BusinessDay: {key}={value:g} must be above 0")
        for key, value in {"base_rate": self.base_rate, "night_share": self.night_share}.items():
            if not value >= 0:
                raise ValueError(f"BusinessDay: {key}={value:g} must be 0 or more")
        hour = self.length / 24
        for key, seconds in {
            "lunch_seconds": self.lunch_seconds,
            "spike_seconds": self.spike_seconds,
        }.items():
            if not 0 <= seconds <= hour:
                raise ValueError(
                    f"BusinessDay: {key}={seconds:g} must be 0 to an hour of the day ({hour:g} s)"
                )
        if not all(0 <= h < 24 for h in (self.lunch_hour, *self.spike_hours)):
            raise ValueError(
                f"BusinessDay: lunch_hour={self.lunch_hour:g} and spike_hours={self.spike_hours}"
                " must be hours 0 to 24"
            )


def day_rate(t: npt.NDArray[np.float64], day: BusinessDay) -> npt.NDArray[np.float64]:
    """Arrival rate (requests/s) at each of ``t`` seconds of trace time (module docstring)."""
    t = np.asarray(t, dtype=np.float64)
    hour = day.length / 24
    night = day.night_share
    share = np.interp(t / hour, _DAY_KNOTS, (night, night, 1.0, 1.0, night, night))
    for start in day.spike_hours:
        inside = (t >= start * hour) & (t < start * hour + day.spike_seconds)
        share = np.where(inside, day.spike_multiple, share)
    noon = day.lunch_hour * hour
    share = np.where((t >= noon) & (t < noon + day.lunch_seconds), day.lunch_multiple, share)
    inside_day = (t >= 0) & (t < day.length)
    rate: npt.NDArray[np.float64] = np.where(inside_day, day.base_rate * share, 0.0)
    return rate


def business_day(day: BusinessDay, seed: int = 0) -> Trace:
    """A Poisson trace with ``day_rate``'s shape, reproducible for a seed.

    Raises:
        ValueError: a knob out of range (``BusinessDay.check``).
    """
    day.check()
    rng = np.random.default_rng(seed)
    peak = day.base_rate * max(1.0, day.night_share, day.lunch_multiple, day.spike_multiple)
    arrival = thinned_arrivals(rng, lambda t: day_rate(t, day), peak, day.length)
    n = len(arrival)
    prompt = lognormal_lengths(rng, day.prompt_median, day.prompt_sigma, day.prompt_range, n)
    output = lognormal_lengths(rng, day.output_median, day.output_sigma, day.output_range, n)
    return Trace("business-day", arrival, prompt, output)


@dataclass(frozen=True, slots=True)
class DayToDay:
    """How one business day differs from the next (module docstring)."""

    volume_sigma: float = 0.15
    """The day's ``base_rate`` is multiplied by exp(N(0, sigma)): about +-15% a day."""
    shift_hours: float = 1.0
    """The lunch burst and each spike move by up to this many hours, earlier or later."""
    weekend_share: float = 0.3
    """Saturday's and Sunday's volume, as a share of a weekday's; no burst or spike."""
    first_weekday: int = 0
    """The weekday of day 0 (0 Monday ... 6 Sunday)."""

    def vary(self, day: BusinessDay, index: int, seed: int) -> BusinessDay:
        """Day ``index``'s knobs, drawn from (``seed``, ``index``) alone."""
        rng = np.random.default_rng([seed, index, 7])
        volume = float(np.exp(rng.normal(0.0, self.volume_sigma)))
        shifts = rng.uniform(-self.shift_hours, self.shift_hours, 1 + len(day.spike_hours))

        def clip(hour: float) -> float:
            return float(np.clip(hour, 0.0, 23.99))

        varied = replace(
            day,
            base_rate=day.base_rate * volume,
            lunch_hour=clip(day.lunch_hour + shifts[0]),
            spike_hours=tuple(
                clip(h + s) for h, s in zip(day.spike_hours, shifts[1:], strict=True)
            ),
        )
        if (self.first_weekday + index) % 7 >= 5:
            varied = replace(
                varied,
                base_rate=varied.base_rate * self.weekend_share,
                lunch_multiple=1.0,
                spike_multiple=1.0,
            )
        return varied


def business_days(
    day: BusinessDay, days: int, seed: int = 0, variation: DayToDay | None = None
) -> Trace:
    """``days`` business days back to back, day ``d`` from seed ``seed + d``.

    A multi-day trace for a seasonal forecast: each day starts ``d * day.length`` seconds
    in, so the same time of day recurs every ``day.length`` seconds. With ``variation``
    each day's knobs are ``variation.vary(day, d, seed)``; without, every day is ``day``.

    Raises:
        ValueError: fewer than one day, or a knob out of range.
    """
    if days < 1:
        raise ValueError(f"days must be at least 1: {days}")
    shapes = [day if variation is None else variation.vary(day, d, seed) for d in range(days)]
    parts = [business_day(shape, seed + d) for d, shape in enumerate(shapes)]
    arrival = np.concatenate([p.arrival + d * day.length for d, p in enumerate(parts)])
    prompt = np.concatenate([p.prompt for p in parts])
    output = np.concatenate([p.output for p in parts])
    return Trace(f"business-days-{days}", arrival, prompt, output)


BUILTINS: dict[str, Callable[[int], Trace]] = {
    "business-day": lambda seed: business_day(BusinessDay(), seed),
    "business-days": lambda seed: business_days(BusinessDay(), 3, seed, DayToDay()),
    "business-week": lambda seed: business_days(BusinessDay(), 7, seed, DayToDay()),
}
"""The workloads ``builtin:NAME`` generates, each from a seed."""


def load_trace(source: str, seed: int = 0) -> Trace:
    """The trace ``source`` names, generated or drawn for ``seed`` where it is not a file.

    ``builtin:NAME``, ServeGen's data (``servegen:DIR?scale=X&days=A-B`` or the
    directory), an Azure CSV or Mooncake JSONL file, or a directory of Azure CSVs read as
    one trace (the gateway's recorded arrivals, ``read_recording``).

    Raises:
        TraceError: an unknown built-in (naming the known ones), ServeGen data
            ``replay.servegen`` refuses, or a file ``read_trace`` (a directory
            ``read_recording``) cannot read.
    """
    if is_servegen(source):
        directory, options = parse_source(source)
        return read_servegen(directory, options, seed)
    if source.startswith(BUILTIN_PREFIX):
        name = source.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTINS:
            known = ", ".join(BUILTIN_PREFIX + n for n in BUILTINS)
            raise TraceError(f"unknown built-in trace {source!r}; one of {known}")
        return BUILTINS[name](seed)
    path = Path(source)
    return read_recording(path) if path.is_dir() else read_trace(path)


def thinned_arrivals(
    rng: np.random.Generator,
    rate: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
    peak: float,
    length: float,
) -> npt.NDArray[np.float64]:
    """Sorted Poisson arrivals in ``[0, length)`` at ``rate(t)`` (at most ``peak``), by thinning.

    Candidates arrive at the peak rate and each is kept with probability
    ``rate(t) / peak``. Draws, in order: the count, the times, the coins.
    """
    count = rng.poisson(peak * length)
    candidates = np.sort(rng.uniform(0.0, length, count))
    keep = rng.random(count) * peak < rate(candidates)
    arrival: npt.NDArray[np.float64] = candidates[keep]
    return arrival


def lognormal_lengths(
    rng: np.random.Generator, median: float, sigma: float, bounds: tuple[int, int], n: int
) -> npt.NDArray[np.int64]:
    """``n`` token counts, log-normal around ``median``, rounded and clipped to ``bounds``."""
    values = np.rint(rng.lognormal(np.log(median), sigma, n)).astype(np.int64)
    clipped: npt.NDArray[np.int64] = np.clip(values, *bounds)
    return clipped
