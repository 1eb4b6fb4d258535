"""The command line's boundary: checked flag types and a parser whose errors are one line.

Each numeric flag's domain is stated once, as its ``type=``: ``real(0, 1_000,
above=True)`` turns the flag's text into a finite number above 0 and at most 1,000, or
refuses it with ``argparse.ArgumentTypeError``. ``Parser`` reports that, and every other
argparse error, as one line naming the flag and exits 2, the status the command's own
``ConfigError`` path (``unitscale.cli.main``) ends with:

    unitscale replay: argument --rate-multiplier: 'nan' is not a number above 0, at most 1,000

Domains are ``[low, high]``, or ``(low, high]`` with ``above``; NaN and the infinities
are outside every one, so nothing downstream sees them.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from foundation.errors import ConfigError, quote
from foundation.replica_model import MAX_PRICE_PER_HOUR
from replay.limits import (
    MAX_RATE_MULTIPLIER,
    MAX_REPLICAS,
    MAX_TIME_COMPRESSION,
    MAX_TOKENS,
    MAX_TRACE_SPAN_SECONDS,
)

if TYPE_CHECKING:
    from replay.simulate import SimConfig

_WHOLE = re.compile(r"\s*[+-]?[0-9]+\s*")
"""An integer as text: optional sign and ASCII digits (``int`` also takes ``1_000``)."""
_REAL = re.compile(r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")
"""A number as text: ASCII digits, an optional fraction and exponent."""
_WHOLE_DIGITS = 30
"""Digits parsed at most: more are out of every range here, and ``int()`` of thousands is
slow."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, without the usage, and exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: MESSAGE (see PROG --help)`` on one line and exit with status 2."""
        line = one_line(f"{self.prog}: {message} (see {self.prog} --help)")
        self.exit(2, line + "\n")


if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[Parser]
    """What ``add_subparsers()`` returns: each subcommand's ``add_command`` adds one to it."""


MAX_LINE_CHARS = 2000
"""Characters of one error line. A message quoting a 100 KB flag value (argparse's
choices, ``[Errno 36] File name too long``) printed all of it."""


def one_line(text: str) -> str:
    r"""``text`` with its line breaks escaped (``\n``): one line, whatever it echoes.

    At most ``MAX_LINE_CHARS``: the middle of a longer one is left out, so the flag it
    names (the head) and what it expects (the tail) both stay.
    """
    line = text.replace("\r", "\\r").replace("\n", "\\n")
    if len(line) <= MAX_LINE_CHARS:
        return line
    head, tail = line[: MAX_LINE_CHARS * 3 // 5], line[-MAX_LINE_CHARS // 5 :]
    return f"{head}… ({len(line) - len(head) - len(tail):,} characters left out) …{tail}"


def real(
    low: float, high: float, *, above: bool = False, below: bool = False
) -> Callable[[str], float]:
    """An argparse ``type=``: a finite number in ``[low, high]``.

    ``above`` leaves ``low`` out of the domain, ``below`` leaves ``high`` out.
    """
    lower = f"above {_show(low)}" if above else f"from {_show(low)}"
    upper = f"below {_show(high)}" if below else f"at most {_show(high)}"
    domain = (
        f"a number {lower}, {upper}"
        if above or below
        else f"a number from {_show(low)} to {_show(high)}"
    )

    def parse(text: str) -> float:
        # ASCII decimal only: float() also takes '1_0', '١' and 'infinity'
        value = float(text) if _REAL.fullmatch(text) else math.nan
        inside = low < value if above else low <= value
        under = value < high if below else value <= high
        if not (inside and under):  # NaN fails both
            raise argparse.ArgumentTypeError(f"{quote(text)} is not {domain}")
        return value

    parse.__name__ = f"real {domain}"
    return parse


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type=``: an integer in ``[low, high]``."""
    domain = f"a whole number from {low:,} to {high:,}"

    def parse(text: str) -> int:
        digits = text.strip().lstrip("+-").lstrip("0")
        value = int(text) if _WHOLE.fullmatch(text) and len(digits) <= _WHOLE_DIGITS else None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{quote(text)} is not {domain}")
        return value

    parse.__name__ = f"whole {domain}"
    return parse


_LISTEN = re.compile(
    r"(?P<host>\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]|[A-Za-z0-9._-]{1,253}):(?P<port>[0-9]{1,5})"
)
"""``HOST:PORT``: a name or IPv4 address, or an IPv6 address in brackets; ASCII digits."""
_LABEL_CHARS = 63
"""A DNS label's most characters (RFC 1035)."""


def host_port(text: str) -> str:
    """An argparse ``type=`` for every ``--listen``, ``--grpc-listen``, ``--metrics-listen``.

    ``HOST:PORT`` with a port 0-65535 (0: the kernel picks one) in ASCII digits, the
    host a name of dot-separated labels of 1-63 characters, an IPv4 address or a
    bracketed IPv6 one. gRPC took ``:99999`` as port 34463 (modulo 65536) and raised a
    45-line RuntimeError on ``[::1:0``.
    """
    if re.fullmatch(r"\[[^\]]*%[^\]]*\]:[0-9]*", text):
        raise argparse.ArgumentTypeError(
            f"{quote(text)}: an IPv6 zone id (%) is not taken; give a global address or ::"
        )
    match = _LISTEN.fullmatch(text)
    valid = match is not None and int(match["port"]) <= 65535
    if valid and match is not None and match["v6"] is not None:
        try:
            ipaddress.IPv6Address(match["v6"])
        except ValueError:
            valid = False
    elif valid and match is not None:
        # DNS labels of 1-63 characters (a trailing dot is the root): the bind's IDNA
        # codec raised a 45-line UnicodeError on a 100-character label or '..' (pass 4, M4).
        labels = match["host"].removesuffix(".").split(".")
        valid = all(1 <= len(label) <= _LABEL_CHARS for label in labels)
    if not valid:
        raise argparse.ArgumentTypeError(
            f"{quote(text)} is not HOST:PORT (host labels of 1-63 characters, a port"
            " 0-65535; IPv6 as [::1]:PORT)"
        )
    return text


host_port.__name__ = "HOST:PORT"


def path(text: str) -> Path:
    """An argparse ``type=`` for a file or directory flag: any UTF-8 path but an empty one.

    ``Path("")`` is the current directory: ``--report ''`` wrote the report there and
    ``--trace ''`` replayed every CSV in it. A name that is not UTF-8 (Linux names are
    bytes) goes into reports: ``--pool``, ``--tasks``, ``--scaler-config`` and ``--out``
    raised ``UnicodeEncodeError`` after the whole run, the report half-written (pass 4, M1).
    """
    if not text:
        raise argparse.ArgumentTypeError("an empty path (it would be the current directory)")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{quote(text)} holds a NUL character")
    if not _utf8(text):
        raise argparse.ArgumentTypeError(
            f"{quote(text)} is not UTF-8 (the name goes into the report); rename it"
        )
    return Path(text)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


path.__name__ = "path"


def trace_source(text: str) -> str:
    """An argparse ``type=`` for ``--trace``: a file, a directory or a ``scheme:`` source.

    Refuses what ``path`` refuses (a name that is not UTF-8 among them: the trace's name
    is written into its report, which raised ``UnicodeEncodeError`` after the whole run
    and left the report half-written); ``replay.workloads`` reads the rest.
    """
    if text and not _utf8(text):
        raise argparse.ArgumentTypeError(
            f"{quote(text)} is not UTF-8 (the trace's name goes into its report); rename it"
        )
    path(text)
    return text


trace_source.__name__ = "trace"


def _show(value: float) -> str:
    """``1000000.0`` as ``1,000,000``, ``0.5`` as ``0.5``."""
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def fail(command: str, problem: object) -> int:
    """Report ``problem`` as ``unitscale COMMAND: PROBLEM`` on one line; the exit status, 2."""
    sys.stderr.write(one_line(f"unitscale {command}: {problem}") + "\n")
    return 2


# --- the domains the commands share -------------------------------------------------------
DAY = 86_400.0

RATE_MULTIPLIER = real(0, MAX_RATE_MULTIPLIER, above=True)
TIME_COMPRESSION = real(0, MAX_TIME_COMPRESSION, above=True)
"""``--time-compression``: trace seconds per wall second."""
SPEEDUP = real(0.001, MAX_TIME_COMPRESSION)
"""``sim-replica --speedup``: engine seconds per wall second; 5e-324 started a replica
that would never answer."""
BUFFER_SIZE = whole(0, 10**6)
"""``gateway --buffer-size``: requests held at zero replicas (the config's bound)."""
SEED = whole(0, 2**63 - 1)
"""numpy's generators take a non-negative seed (-1 raised inside numpy)."""
REPLICAS = whole(1, MAX_REPLICAS)
"""``--max-replicas`` of a simulated fleet: 0 replayed a fleet that can serve nothing."""
SLEEPING = whole(0, MAX_REPLICAS)
TIER_SLEEPING = 4
"""``replay --compare-tiers``' ``--max-sleeping`` by default."""
BURST_SLEEPERS = real(0, MAX_REPLICAS)
"""``--standby-burst-sleepers``: sleepers per running replica (capped by the maximum)."""
DEMO_COMPRESSION = real(0, 50, above=True)
"""The demo's ``--time-compression``: its gateway's 5 s standby interval, compressed, stays at
or above the 100 ms the gateway config takes."""
DEMO_REPLICAS = whole(1, 64)
"""The demo's ``--max-replicas``: each replica is a process on this machine."""
CONCURRENCY = real(0, 100_000, above=True)
"""``--target-concurrency``: requests per replica (vLLM batches at most a few hundred)."""
PRICE = real(0.000001, MAX_PRICE_PER_HOUR)
"""``--price``: US$ per accelerator-hour, from a millionth of a dollar; NaN made every
cost NaN and failed late, and 0 (or 5e-324) made every trial of ``tune`` cost nothing (a
cost per 1M tokens of inf, its proposal "nan% dearer")."""
SLO_SECONDS = real(0.001, DAY)
"""``--slo-ttft`` and ``--slo-itl``: from a millisecond (a target of 0 can never be met,
and 5e-324 overflowed the replay's division by it) to a day."""
IDLE_GRACE = real(0, DAY)
DEMO_SECONDS = real(0, DAY, above=True)
"""The demo's ``--duration``: wall seconds it plays."""
SHARE = real(0, 1, above=True)
"""``--pool-fraction``: a share of the nodes and tasks, above 0."""
TRAINING_LOAD = real(0, MAX_RATE_MULTIPLIER, above=True)
TASK_SECONDS = real(0, MAX_TRACE_SPAN_SECONDS, above=True)
"""``--max-task-seconds``: no cap longer than a trace may span."""
HEADROOM = real(0, 10)
"""``--headroom``: a share of inference's forecast kept free; 10 keeps ten times it."""
BATCHED_TOKENS = whole(1, MAX_TOKENS)
"""``--max-num-batched-tokens`` (the profile's ``max_num_seqs`` is checked on top)."""
ATTAINMENT = real(0, 1, above=True, below=True)
"""``--slo-attainment``: a share of requests, as the scaler config's ``slo-attainment``."""
TRIALS = whole(1, 10_000)
"""``tune --budget``: replays of every trace, one configuration each."""
BATCH = whole(1, 1_024)
"""``tune --batch``: trials the sampler proposes before it sees their results."""
WORKERS = whole(1, 1_024)
"""``tune --workers``: processes replaying trials at once."""
TARGET_CONCURRENCY = 32.0
"""``--target-concurrency`` of ``replay`` and ``tune`` by default: the trigger's
``targetConcurrency`` as deploy/scaledobjects/recommended.yaml sets it."""

UNITSCALE_FLAGS: dict[str, object] = {
    "target_concurrency": TARGET_CONCURRENCY,
    "scaler_config": None,
    "standby_max_sleeping": 0,
    "standby_burst_sleepers": 0.0,
}
"""The flags (by their ``argparse`` names) only the unitscale policy reads, and their
defaults: ``replay --policy kpa --target-concurrency 8`` replayed KPA with the flag
dropped without a word."""


def unitscale_only(args: argparse.Namespace, policy: str) -> None:
    """Refuse a flag of ``UNITSCALE_FLAGS`` set for a run whose ``policy`` never reads it.

    ``policy`` is the one policy run (``all`` and ``unitscale`` read them all).

    Raises:
        ConfigError: naming the first such flag.
    """
    if policy in {"all", "unitscale"}:
        return
    for name, default in UNITSCALE_FLAGS.items():
        if getattr(args, name, default) != default:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} is the unitscale policy's: drop it for {policy}")


def fleet_of(args: argparse.Namespace) -> SimConfig:
    """The fleet the replay's flags describe, for ``unitscale replay`` and ``tune`` alike.

    ``--profile``, ``--slo-*``, ``--cold-start``, ``--max-replicas``, ``--price`` and
    ``--prewarm`` and ``--standby-*`` where the command has them, through
    ``replay.run.fleet_config``.

    Raises:
        ConfigError: an unknown profile or cold-start tier, naming the known ones; burst
            sleepers without sleepers.
    """
    from replay.run import fleet_config
    from scaler.core.tiers import StandbyPolicy

    most = getattr(args, "standby_max_sleeping", 0)
    burst = getattr(args, "standby_burst_sleepers", 0.0)
    if burst > 0 and most == 0:
        raise ConfigError("--standby-burst-sleepers holds sleepers: give --standby-max-sleeping")
    standby = StandbyPolicy(max_sleeping=most, burst_sleepers=burst) if most else None
    try:
        return fleet_config(
            args.profile,
            slo_ttft=args.slo_ttft,
            slo_itl=args.slo_itl,
            cold_start=args.cold_start,
            max_replicas=args.max_replicas,
            price=args.price,
            prewarm=getattr(args, "prewarm", False),
            standby=standby,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def standby_arguments(group: argparse._ActionsContainer) -> None:
    """``--standby-max-sleeping`` and ``--standby-burst-sleepers``: unitscale's warm tier."""
    group.add_argument(
        "--standby-max-sleeping",
        type=SLEEPING,
        default=0,
        help="unitscale holds up to this many sleeping replicas, as the trigger's standby:"
        " true with standbyMaxSleeping, and the gateway wakes them at its recommended"
        " wake-at-outstanding (default 0: none; the other policies never hold any)",
    )
    group.add_argument(
        "--standby-burst-sleepers",
        type=BURST_SLEEPERS,
        default=0.0,
        help="the trigger's standbyBurstSleepers: sleepers per running replica held for a"
        " burst (default 0)",
    )
