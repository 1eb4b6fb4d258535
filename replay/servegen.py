"""ServeGen's per-client production traces, drawn into a replay trace for a day range.

The data (alibaba/ServeGen ``data/language/<model>/``; ``../shared/traces/servegen-m-small``)
is one pair of files per client N: ``chunk-N-trace.csv``, one row per 10-minute window
``start_s,rate,cv,pattern,shape,scale`` (mean requests/s, the inter-arrival times'
coefficient of variation, the fitted ``Gamma`` or ``Weibull`` and its parameters; no
pattern when the client sent nothing), and ``chunk-N-dataset.json``, its prompt and
output token-length distributions every 6 hours, ``{start_s: {"input_tokens":
"{tokens: probability, ...}", "output_tokens": "..."}}`` (``"{}"`` when none).

``unitscale replay --trace 'servegen:DIR?scale=0.01&days=0-2'`` (or a bare ``DIR``) draws:

- **how many** requests a client sends in a window: its ``rate`` x ``scale`` x the
  window's seconds, rounded down or up at random by the fraction (so the expectation is
  exact). The count is what the trace measured; a free renewal process at a Weibull
  window's cv (up to 45) would make one window's count vary a hundredfold around it.
- **when**: the window's ``n`` arrivals are the first ``n`` of ``n + 1`` gaps drawn from
  the fitted family at the fitted *shape*, scaled to fill the window (for Gamma gaps this
  is exactly a Gamma renewal process conditioned on its count). The fitted *scale* is not
  used: its mean gap disagrees with the window's rate (Weibull fits: median 1.2x, up to
  2,000x), and the rate is what the trace measured. The shape keeps the burstiness at
  any ``scale`` (thinning would push it toward Poisson).
- **how long**: prompt and output tokens drawn (independently, as the data gives them)
  from the client's distribution of the 6-hour block holding the window, else the
  nearest block that has one. Clients with none at all (5 of 43 here, 57% of the
  requests) draw from the lengths drawn for the others that day: the traffic-weighted mix.

Days are 86,400 s from the trace's 0; ``days=A-B`` (inclusive; ``A`` alone for one) keeps
those, with times from the start of day ``A``. Each day is drawn from its own generator
(``seed``, day), so day 2 is the same whether asked for alone or as part of 0-2: a policy
tuned on days 0-1 is judged on the very day 2 another run replays. Every count is
bounded (``replay.limits``) before the arrays it sizes exist: at ``scale`` 1 one day of
m-small is 101 million requests; 0.01 is about a million.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np
import numpy.typing as npt

from foundation.errors import quote
from foundation.files import read_bytes
from replay.limits import MAX_RATE_MULTIPLIER, MAX_TOKENS, MAX_TRACE_REQUESTS
from replay.trace import Trace, TraceError, _lines

PREFIX = "servegen:"
DAY_SECONDS = 86_400
WINDOW_SECONDS = 600.0
"""The last window's length (the data's windows are 10 minutes)."""
BLOCK_SECONDS = 21_600.0
"""The span of one block of token-length distributions (the data's are 6 hours)."""
MAX_DAYS = 31
"""Days a trace may hold: ``replay.limits.MAX_TRACE_SPAN_SECONDS``."""
MAX_RATE = 1e6
"""Requests per second of one client in one window; above it is a bad row."""
MIN_WEIBULL_SHAPE = 0.01
"""The least Weibull shape a window may have: its gaps, (-ln U)^(1/shape) with -ln U at
most 37 in doubles, stay below 1e157, and a day's sum of them finite."""
MAX_DATASET_BYTES = 64 * 1024**2
"""One client's distributions file (the largest here is 3.9 MB)."""
MAX_DATASETS_BYTES = 1024**3
"""Every client's distributions files together (here 30 MB): kept as text until drawn,
so 100 files of 60 MB ended in MemoryError (hostile pass 4, H3)."""
MAX_CHUNKS = 10_000
"""Clients of a directory (here 43): as ``replay.trace.MAX_RECORDING_FILES``."""
MAX_WINDOWS = 1_000_000
"""Windows of every client together (here 86,688; 31 days of 10-minute windows for 43
clients is 192,000): a float ``start_s`` step let one file hold millions (pass 4, L2)."""
PATTERNS = ("", "Gamma", "Weibull")
MAX_PDF_CHARS = 16 * 1024**2
"""One distribution's text (the largest here is 405 KB)."""
MAX_PDF_PAIRS = 1_000_000
"""Token counts in one distribution (the most here is 13,759)."""
MAX_PAIRS = 10_000_000
"""Token counts in every distribution of a directory together (here about a million):
each used is parsed once (~1 s a million) and kept for the days drawn; 8 clients of one
8 MB file took 19 s a day, parsed again each day (hostile pass 5, M4)."""
# ASCII digits only: ``\d`` and float() also take '١٠' and '1_0' (hostile pass 3, L5).
_CHUNK = re.compile(r"chunk-([0-9]{1,6})-trace\.csv")
_TOKENS = re.compile(r"[0-9]{1,9}")
# One way to match each text (no nested or adjacent repeats that share characters), so
# a miss costs one pass: the old whole-dict pattern backtracked ~n^3 on trailing spaces.
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")


@dataclass(frozen=True, slots=True)
class ServeGenOptions:
    """What to draw: ``scale`` x the recorded rates, for ``days`` (inclusive; None: all)."""

    scale: float = 0.01
    days: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class _Client:
    """One client's windows (arrays by window) and its token-length blocks."""

    start: npt.NDArray[np.float64]
    length: npt.NDArray[np.float64]
    rate: npt.NDArray[np.float64]
    family: npt.NDArray[np.int64]
    """Index into ``PATTERNS``; 0 (none) with a rate draws Poisson gaps (shape 1)."""
    shape: npt.NDArray[np.float64]
    blocks: dict[int, tuple[str, str]]
    """Block start -> (input, output) distribution text, the non-empty ones."""
    data_bytes: int
    """The size of its distributions file (0 when it has none)."""
    pairs: int
    """Token counts in its distributions, as their texts' commas say (before any parse)."""
    dataset: Path
    parsed: dict[tuple[int, int], tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]] = field(
        default_factory=dict
    )
    """(block, 0 input / 1 output) -> ``_pdf``'s arrays, parsed once for every day drawn."""


def is_servegen(source: str) -> bool:
    """Whether ``source`` names ServeGen data: ``servegen:...`` or a directory of chunks."""
    if source.startswith(PREFIX):
        return True
    path = Path(source.partition("?")[0])
    return path.is_dir() and any(path.glob("chunk-*-trace.csv"))


def parse_source(source: str) -> tuple[Path, ServeGenOptions]:
    """``[servegen:]DIR[?scale=X&days=A-B]`` as the directory and the options.

    Raises:
        TraceError: no directory, an unknown or repeated option, a scale not above 0 and at most
            ``MAX_RATE_MULTIPLIER``, or days that are not ``A`` or ``A-B`` with A <= B.
    """
    path, _, query = source.removeprefix(PREFIX).partition("?")
    if not path.strip():
        # Read as ".", it replayed whatever chunk files the working directory held.
        raise TraceError(f"{source}: needs a directory before '?' (an empty one would be '.')")
    scale, days = ServeGenOptions().scale, None
    seen: set[str] = set()
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in seen:  # the last one won, the first dropped without a word
            raise TraceError(f"{source}: {quote(key)} given twice; give it once")
        seen.add(key)
        if key == "scale":
            # ASCII only: float() takes '١' as 1 (hostile pass 5, L1)
            scale = float(value) if _DECIMAL.fullmatch(value.strip()) else math.nan
            if not 0 < scale <= MAX_RATE_MULTIPLIER:
                raise TraceError(
                    f"{source}: scale={quote(value)} must be above 0, at most"
                    f" {MAX_RATE_MULTIPLIER:,g}"
                )
        elif key == "days":
            match = re.fullmatch(r"([0-9]{1,4})(?:-([0-9]{1,4}))?", value)
            if match is None or int(match[2] or match[1]) < int(match[1]):
                raise TraceError(f"{source}: days={quote(value)} must be A or A-B with A <= B")
            days = (int(match[1]), int(match[2] or match[1]))
        else:
            raise TraceError(f"{source}: unknown option {quote(key)}; scale=X and days=A-B")
    return Path(path), ServeGenOptions(scale, days)


def read_servegen(directory: Path, options: ServeGenOptions, seed: int = 0) -> Trace:
    """The requests ``options`` asks of the ServeGen data in ``directory`` (module docstring).

    Raises:
        TraceError: no chunks, a malformed row or distribution (naming the file, line or
            block, and column), days past the data, more than ``MAX_TRACE_REQUESTS`` or
            no request at all.
    """
    clients = _read_clients(directory)
    available = max(math.ceil((c.start[-1] + c.length[-1]) / DAY_SECONDS) for c in clients)
    first, last = options.days if options.days is not None else (0, available - 1)
    if last >= available:
        raise TraceError(f"{directory}: days {first}-{last}: the data holds days 0-{available - 1}")
    if last - first + 1 > MAX_DAYS:
        # Two problems apart: "days 0-31: the data holds days 0-31" read as a contradiction.
        pick = "; choose some with ?days=A-B" if options.days is None else ""
        raise TraceError(
            f"{directory}: days {first}-{last} are {last - first + 1} days; a replay spans"
            f" at most {MAX_DAYS}{pick}"
        )
    _check_count(directory, clients, options.scale, first, last)
    parts = [_draw_day(clients, options.scale, day, seed) for day in range(first, last + 1)]
    arrival = np.concatenate([p[0] for p in parts]) - first * DAY_SECONDS
    if not len(arrival):
        raise TraceError(
            f"{directory}: days {first}-{last} at scale {options.scale:g} drew no request"
        )
    name = f"servegen-{directory.name}-days-{first}-{last}-x{options.scale:g}"
    return Trace(
        name, arrival, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    )


def _read_clients(directory: Path) -> list[_Client]:
    """Every client, within ``MAX_WINDOWS``, ``MAX_DATASETS_BYTES`` and ``MAX_PAIRS`` in all.

    Each file has its own bound too; these bound their number, which a directory does not.
    """
    clients: list[_Client] = []
    windows = data = pairs = 0
    for path in _chunks(directory):
        left = (MAX_WINDOWS - windows, MAX_DATASETS_BYTES - data, MAX_PAIRS - pairs)
        client = _read_client(path, *left)
        windows += len(client.start)
        data += client.data_bytes
        pairs += client.pairs
        clients.append(client)
    return clients


def _chunks(directory: Path) -> list[Path]:
    try:
        names = [(int(m[1]), p) for p in directory.iterdir() if (m := _CHUNK.fullmatch(p.name))]
    except OSError as err:
        raise TraceError(f"cannot read ServeGen data {directory}: {err.strerror}") from err
    if not names:
        raise TraceError(f"{directory}: no chunk-N-trace.csv (ServeGen's per-client files)")
    if len(names) > MAX_CHUNKS:  # before any is read
        raise TraceError(
            f"{directory}: {len(names):,} chunk-N-trace.csv files; a replay reads at most"
            f" {MAX_CHUNKS:,} clients"
        )
    return [path for _, path in sorted(names)]


def _read_client(path: Path, windows_left: int, bytes_left: int, pairs_left: int) -> _Client:
    """A client's windows, each row checked; its distributions' blocks, not yet parsed.

    ``windows_left``, ``bytes_left``, ``pairs_left``: what the directory's bounds leave
    for this client.
    """
    rows: list[tuple[float, float, int, float]] = []
    for number, fields in _rows(path):
        if len(rows) >= windows_left:
            raise TraceError(
                f"{path}:{number}: the directory's clients hold more than {MAX_WINDOWS:,}"
                " windows in all, the most a replay reads"
            )
        try:
            start = _number(fields[0], "start_s", 0.0, MAX_DAYS * DAY_SECONDS)
            rate = _number(fields[1], "rate", 0.0, MAX_RATE)
            if fields[3] not in PATTERNS:
                raise ValueError(f"column pattern: {quote(fields[3])} is not Gamma or Weibull")
            family = PATTERNS.index(fields[3])
            # Weibull gaps are (-ln U)^(1/shape): at 1e-3 they overflowed to inf and
            # the day's arrivals became NaN (hostile pass 12); the data's least is 0.16.
            least = MIN_WEIBULL_SHAPE if fields[3] == "Weibull" else 1e-3
            shape = _number(fields[4], "shape", least, 1e3) if family else 1.0
            _number(fields[2], "cv", 0.0, math.inf)
        except ValueError as err:
            raise TraceError(f"{path}:{number}: {err}") from err
        if rows and not start > rows[-1][0]:
            raise TraceError(f"{path}:{number}: column start_s: {start:g} is not after the last")
        rows.append((start, rate, family, shape))
    if not rows:
        raise TraceError(f"{path}: no windows")
    starts = np.array([r[0] for r in rows])
    dataset = path.with_name(path.name.replace("-trace.csv", "-dataset.json"))
    return _Client(
        starts,
        np.diff(starts, append=starts[-1] + WINDOW_SECONDS),
        np.array([r[1] for r in rows]),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.array([r[3] for r in rows]),
        *_blocks(dataset, bytes_left, pairs_left),
        dataset,
    )


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    lines = _lines(path)
    try:
        for number, text in lines:
            if not text.strip():
                continue
            fields = next(csv.reader([text]))
            if len(fields) != 6:
                raise TraceError(
                    f"{path}:{number}: {len(fields)} columns, not 6"
                    " (start_s,rate,cv,pattern,shape,scale)"
                )
            yield number, fields
    except csv.Error as err:
        raise TraceError(f"{path}: not CSV: {err}") from err
    finally:
        lines.close()


def _number(text: str, column: str, low: float, high: float) -> float:
    """A finite number from ``low`` to ``high`` (an empty field is 0 where 0 is allowed)."""
    field = text.strip()
    value = float(field) if _DECIMAL.fullmatch(field) else 0.0 if not field else math.nan
    if not low <= value <= high:
        raise ValueError(f"column {column}: {quote(text)} is not a number from {low:g} to {high:g}")
    return value


_KEY_DIGITS = 9
"""Digits of a block's start second: 31 days are 7."""


def _blocks(
    path: Path, bytes_left: int, pairs_left: int
) -> tuple[dict[int, tuple[str, str]], int, int]:
    """A distributions file's non-empty blocks (none if missing), size and token counts.

    Its token counts are its texts' commas + 1, counted before any is parsed. Refused when
    it holds more than ``bytes_left`` (before it is parsed) or more than ``pairs_left``
    token counts (before any distribution is).
    """
    if not path.exists():
        return {}, 0, 0
    # A regular file, read to the bound: stat() says 0 for /dev/zero, and a FIFO blocks.
    raw = read_bytes(path, MAX_DATASET_BYTES, "ServeGen dataset", TraceError)
    if len(raw) > bytes_left:
        raise TraceError(
            f"{path}: the directory's chunk-N-dataset.json files are over"
            f" {MAX_DATASETS_BYTES / 1024**3:g} GiB in all, the most a replay reads"
        )
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise TraceError(f"{path}: not JSON") from err
    if not isinstance(data, dict):
        raise TraceError(f"{path}: not a JSON object of blocks")
    blocks = {}
    starts: set[int] = set()
    for key, block in data.items():
        fields = block if isinstance(block, dict) else {}
        texts = (fields.get("input_tokens"), fields.get("output_tokens"))
        # ASCII digits, 9 at most: isdigit() is true for '²' and for 5,000 digits, on
        # which int() raised.
        start = key.isascii() and key.isdigit() and len(key) <= _KEY_DIGITS
        if not start or not all(isinstance(t, str) for t in texts):
            raise TraceError(
                f"{path}: block {quote(key)}: not a start second with input_tokens and"
                " output_tokens texts"
            )
        if int(key) in starts:  # "0" and "00": the later replaced the earlier silently
            raise TraceError(f"{path}: block {quote(key)} starts where another block does")
        starts.add(int(key))
        if all(t.strip() != "{}" for t in texts):  # type: ignore[union-attr]
            blocks[int(key)] = (str(texts[0]), str(texts[1]))
    pairs = sum(text.count(",") + 1 for both in blocks.values() for text in both)
    if pairs > pairs_left:
        raise TraceError(
            f"{path}: the directory's distributions hold more than {MAX_PAIRS:,} token"
            " counts in all, the most a replay reads"
        )
    return blocks, len(raw), pairs


def _pdf(text: str, where: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A ``{tokens: probability, ...}`` text as token counts and their cumulative shares."""
    pairs = _pairs(text)
    if pairs is None:
        raise TraceError(f"{where}: not a {{tokens: probability, ...}} dict")
    tokens = np.array([int(t) if _TOKENS.fullmatch(t) else -1 for t, _ in pairs], dtype=np.int64)
    weights = np.array([float(p) if _DECIMAL.fullmatch(p) else math.nan for _, p in pairs])
    if not (
        len(pairs)
        and np.all((tokens >= 0) & (tokens <= MAX_TOKENS))
        and np.all(np.isfinite(weights) & (weights >= 0))
        and weights.max() > 0
    ):
        raise TraceError(
            f"{where}: token counts must be 0 to {MAX_TOKENS:,}, probabilities finite,"
            " not negative and not all 0"
        )
    with np.errstate(over="ignore"):  # an overflow is the case taken care of below
        total = weights.sum()
    if not np.isfinite(total):
        # Weights each finite summed to inf (1e308 three times), the shares to NaN and
        # every draw to one count (hostile pass 56): over the largest, they sum finite.
        weights = weights / weights.max()
    cumulative = np.cumsum(weights)
    return np.maximum(tokens, 1), cumulative / cumulative[-1]


def _pairs(text: str) -> list[tuple[str, str]] | None:
    """The stripped ``tokens``/``probability`` texts of a dict's text; None if not one.

    Split, never matched whole: linear in the text, bounded before any list is built.
    """
    body = text.strip()
    if len(body) > MAX_PDF_CHARS or body[:1] != "{" or body[-1:] != "}":
        return None
    body = body[1:-1]
    if body.count(",") >= MAX_PDF_PAIRS or any(c in body for c in "{}"):
        return None
    items = body.split(",")
    if len(items) > 1 and not items[-1].strip():
        items.pop()  # one trailing comma, as Python writes none but a person might
    pairs = []
    for item in items:
        key, colon, value = item.partition(":")
        if not colon and not item.strip() and len(items) == 1:
            return []  # "{}"
        if not colon or ":" in value or not key.strip() or not value.strip():
            return None
        pairs.append((key.strip(), value.strip()))
    return pairs


def _check_count(
    directory: Path, clients: list[_Client], scale: float, first: int, last: int
) -> None:
    """Refuse, before drawing, a range whose requests could pass ``MAX_TRACE_REQUESTS``."""
    low, high = first * DAY_SECONDS, (last + 1) * DAY_SECONDS
    most = 0.0
    for c in clients:
        inside = (c.start >= low) & (c.start < high)
        most += float(np.ceil(c.rate[inside] * scale * c.length[inside]).sum())
    if most > MAX_TRACE_REQUESTS:
        raise TraceError(
            f"{directory}: days {first}-{last} at scale {scale:g} is up to {most:,.0f}"
            f" requests; a replay holds at most {MAX_TRACE_REQUESTS:,}: ask for fewer days"
            " (days=A-B) or a smaller scale"
        )


def _draw_day(
    clients: list[_Client], scale: float, day: int, seed: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Day ``day``'s requests from every client, sorted: (arrival, prompt, output)."""
    rng = np.random.default_rng([seed, day])
    low, high = day * DAY_SECONDS, (day + 1) * DAY_SECONDS
    times, prompts, outputs, orphans = [], [], [], []
    for c in clients:
        inside = (c.start >= low) & (c.start < high)
        arrival, window = _arrivals(rng, c, np.flatnonzero(inside), scale)
        prompt, output = _lengths(rng, c, c.start[window])
        times.append(arrival)
        prompts.append(prompt)
        outputs.append(output)
        orphans.append(np.full(len(arrival), not c.blocks))
    arrival, prompt, output = (
        np.concatenate(times),
        np.concatenate(prompts),
        np.concatenate(outputs),
    )
    orphan = np.concatenate(orphans)
    if orphan.any():
        donors = np.flatnonzero(~orphan)
        if len(donors) == 0:
            raise TraceError(f"day {day}: no client has a token-length distribution")
        pick = donors[rng.integers(0, len(donors), int(orphan.sum()))]
        prompt[orphan], output[orphan] = prompt[pick], output[pick]
    order = np.argsort(arrival, kind="stable")
    return arrival[order], prompt[order], output[order]


def _arrivals(
    rng: np.random.Generator, c: _Client, windows: npt.NDArray[np.int64], scale: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The windows' arrivals (unsorted) and each one's window index (module docstring)."""
    expected = c.rate[windows] * scale * c.length[windows]
    whole = np.floor(expected)
    counts = (whole + (rng.random(len(windows)) < expected - whole)).astype(np.int64)
    windows, counts = windows[counts > 0], counts[counts > 0]
    gaps_per = counts + 1
    shape = np.repeat(c.shape[windows], gaps_per)
    weibull = np.repeat(c.family[windows] == PATTERNS.index("Weibull"), gaps_per)
    gaps = np.where(weibull, rng.weibull(shape), rng.standard_gamma(shape))
    first = np.cumsum(gaps_per) - gaps_per  # each window's first gap
    total = np.add.reduceat(gaps, first) if len(first) else np.zeros(0)
    share = gaps / np.repeat(np.where(total > 0, total, 1.0), gaps_per)
    ends = np.cumsum(share)
    within = ends - np.repeat(ends[first] - share[first], gaps_per)
    keep = np.ones(len(gaps), dtype=bool)
    keep[first + counts] = False  # the last gap closes the window
    window = np.repeat(windows, gaps_per)[keep]
    within = np.clip(within[keep], 0.0, 1.0)
    return c.start[window] + within * c.length[window], window


def _lengths(
    rng: np.random.Generator, c: _Client, starts: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Prompt and output tokens for requests in windows starting at ``starts``."""
    prompt = np.ones(len(starts), dtype=np.int64)
    output = np.ones(len(starts), dtype=np.int64)
    if not c.blocks or not len(starts):
        return prompt, output
    keys = np.array(sorted(c.blocks), dtype=np.float64)
    block = _nearest_block(keys, starts)
    for b in np.unique(block):
        mine = block == b
        key = int(keys[b])
        for side, (target, name) in enumerate(
            ((prompt, "input_tokens"), (output, "output_tokens"))
        ):
            if (key, side) not in c.parsed:  # once, whatever the days drawn
                c.parsed[key, side] = _pdf(c.blocks[key][side], f"{c.dataset}: block {key}, {name}")
            tokens, cdf = c.parsed[key, side]
            pick = np.searchsorted(cdf, rng.random(int(mine.sum())), side="right")
            target[mine] = tokens[np.minimum(pick, len(tokens) - 1)]
    return prompt, output


def _nearest_block(
    keys: npt.NDArray[np.float64], starts: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """Per window start, the index of the block holding it, else of the nearest block.

    Block ``k`` covers ``[k, k + BLOCK_SECONDS)``. A start outside every block (before the
    first, or in a block the data left empty) takes the block whose span is nearest to
    it, the earlier on a tie. Example, blocks at 0 and 43,200 (21,600 empty): a window at
    25,000 is 3,400 s past the first's span and 18,200 s before the second: the first.
    """
    before = np.searchsorted(keys, starts, side="right") - 1
    prev = np.clip(before, 0, len(keys) - 1)
    nxt = np.clip(before + 1, 0, len(keys) - 1)
    behind = np.where(before >= 0, np.maximum(starts - keys[prev] - BLOCK_SECONDS, 0.0), np.inf)
    ahead = np.where(before + 1 < len(keys), keys[nxt] - starts, np.inf)
    nearest: npt.NDArray[np.int64] = np.where(behind <= ahead, prev, nxt).astype(np.int64)
    return nearest
