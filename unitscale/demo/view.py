"""The demo's live view: a rich panel on a terminal, plain log lines otherwise."""

from __future__ import annotations

import math
import sys
from collections import deque
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from unitscale.demo.observe import Sample


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    # Unmeasured (None) or undefined (cost per token with no token served) shows as "-".
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:{spec}}{unit}"


class View:
    """Shows every sample and every event; ``live`` picks the panel over log lines."""

    def __init__(self, title: str, trace_seconds: float, live: bool | None = None) -> None:
        self.title = title
        self.trace_seconds = trace_seconds
        self.live = sys.stdout.isatty() if live is None else live
        self.events: deque[str] = deque(maxlen=12)
        self.last: Sample | None = None
        self._console = Console()
        self._live: Live | None = None
        self._header = True

    def __enter__(self) -> View:
        if self.live:
            self._live = Live(self._render(), console=self._console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.__exit__(kind, error, trace)
            self._live = None

    def event(self, t: float, text: str) -> None:
        """A decision or an action, at trace time ``t``."""
        line = f"{_clock(t)}  {text}"
        self.events.append(line)
        if self._live is not None:
            self._live.update(self._render())
        else:
            print(f"  event {line}", flush=True)

    def sample(self, sample: Sample) -> None:
        self.last = sample
        if self._live is not None:
            self._live.update(self._render())
            return
        if self._header:
            print(
                f"{'trace t':>8} {'req/s':>6} {'replicas':>8} {'ready':>5} {'asleep':>6}"
                f" {'buffer':>6}"
                f" {'queue':>6} {'TTFT p95':>8} {'ITL p95':>8} {'$/1M tok':>8}",
                flush=True,
            )
            self._header = False
        s = sample
        print(
            f"{_clock(s.t):>8} {_fmt(s.arrival_rate, '6.2f')} {s.replicas:>8} {s.ready:>5}"
            f" {s.sleeping:>6}"
            f" {_fmt(s.buffered, '6d') if s.buffered is not None else '     -'}"
            f" {_fmt(s.engine_queue, '6.0f')} {_fmt(s.ttft_p95, '7.2f', 's')}"
            f" {_fmt(s.itl_p95, '7.3f', 's')} {_fmt(s.cost_per_million, '8.3f')}",
            flush=True,
        )

    def _render(self) -> Group:
        s = self.last
        table = Table.grid(padding=(0, 1))
        for justify in ("right", "left", "right", "left"):
            table.add_column(justify=justify)
        if s is None:
            table.add_row("", "starting the scaler, exporter and gateway...", "", "")
        else:
            rows = (
                (_fmt(s.arrival_rate, ".2f"), "req/s at the gateway",
                 _fmt(s.ttft_p95, ".2f", " s"), "TTFT p95"),
                (f"{s.replicas} ({s.ready} ready, {s.sleeping} asleep)", "replicas",
                 _fmt(s.itl_p95, ".3f", " s"), "inter-token p95"),
                (str(s.buffered) if s.buffered is not None else "-", "buffered at the gateway",
                 _fmt(s.cost_per_million, ".3f"), "US$ per 1M tokens"),
                (_fmt(s.engine_queue, ".0f"), "queued in engines",
                 _fmt(s.running, ".0f"), "running in engines"),
            )  # fmt: skip
            for a, label_a, b, label_b in rows:
                table.add_row(Text(a, style="bold"), label_a, Text(b, style="bold"), label_b)
        t = s.t if s is not None else 0.0
        header = Text(
            f"{self.title}   trace time {_clock(t)} of {_clock(self.trace_seconds)}",
            style="bold cyan",
        )
        events = Text("\n".join(self.events) or "(no decision yet)", overflow="ellipsis")
        return Group(header, table, Panel(events, title="decisions (trace time)"))


def _clock(t: float) -> str:
    minutes, seconds = divmod(int(t), 60)
    return f"{minutes:02d}:{seconds:02d}"
