"""What several subcommands share: listen and config flags, serving until a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from foundation.errors import ConfigError, quote
from unitscale import flags

if TYPE_CHECKING:
    from foundation.reload import ConfigSource
    from foundation.replica_model import Profile
    from replay.trace import Trace

log = logging.getLogger("unitscale")
T = TypeVar("T")

MIN_CONFIG_POLL = 0.01
"""The shortest ``--config-poll`` (seconds): at most 100 checks of the file a second.
1 ns was ~5,000 a second, 41% of a core while idle; ``unitscale demo`` polls every 50 ms."""
MAX_CONFIG_POLL = 600.0
"""The longest ``--config-poll`` (seconds), as the sixth pass bounded the scaler's source
waits: ``2562047h`` started a server that would see a changed file in 292 years, with
nothing said (hostile pass 7)."""
MAX_TRACES = 16
"""``--trace`` values one run reads (``replay --pool``: a deployment each; ``tune``: every
trial replays each). Every trace was read and held before the run with no bound on their
count or their requests together, each within one replay's bound: ten built-in days at
``--rate-multiplier 50`` held 2.4 GB after 18 s, and a hundred would have asked 24 GB
(hostile pass 8, CM-1). Together they hold at most one replay's ``MAX_TRACE_REQUESTS``."""


# --- flags ---------------------------------------------------------------------------------


def listen_argument(command: argparse.ArgumentParser, flag: str, default: str, what: str) -> None:
    """A ``HOST:PORT`` to serve ``what`` on."""
    command.add_argument(
        flag, type=flags.host_port, default=default, help=f"{what} (default %(default)s)"
    )


def config_arguments(command: argparse.ArgumentParser, config_help: str) -> None:
    """Where a server's hot-reloaded config comes from: ``config_source`` reads them."""
    command.add_argument("--config", type=flags.path, help=config_help)
    command.add_argument(
        "--config-configmap",
        metavar="NAMESPACE/NAME[:KEY]",
        help="read and watch the config from this ConfigMap through the API "
        "(key default config.yaml) instead of --config",
    )
    command.add_argument(
        "--config-poll",
        default="1s",
        metavar="DURATION",
        help="how often --config is checked for changes (Go duration, default %(default)s)",
    )
    kubeconfig_argument(command)


def kubeconfig_argument(command: argparse.ArgumentParser) -> None:
    """``--kubeconfig``: how a server reaches the API."""
    command.add_argument(
        "--kubeconfig",
        type=flags.path,
        help="kubeconfig for API access (default: in-cluster service account when in a "
        "pod, else $KUBECONFIG or ~/.kube/config)",
    )


def dns_argument(command: argparse.ArgumentParser) -> None:
    """``--dns``: replicas found as the A records of a headless Service."""
    command.add_argument("--dns", help="host:port of a headless Service: every A record a replica")


def cold_start_argument(command: argparse.ArgumentParser) -> None:
    """``--cold-start``: the tier a simulated replica starts from."""
    command.add_argument(
        "--cold-start", default="local-disk", help="cached | local-disk | remote | new-node"
    )


def config_source(args: argparse.Namespace) -> ConfigSource:
    """The config source ``config_arguments``' flags name, ``--config-poll`` checked."""
    from foundation.durations import parse_duration
    from foundation.kube import KubeAccess
    from foundation.reload import ConfigSource

    try:
        poll = parse_duration(args.config_poll)
    except ValueError as err:
        raise ConfigError(f"--config-poll {args.config_poll!r}: {err}") from err
    if not poll >= MIN_CONFIG_POLL:
        raise ConfigError(
            f"--config-poll {args.config_poll!r}: must be at least {MIN_CONFIG_POLL * 1000:g}ms"
        )
    if poll > MAX_CONFIG_POLL:
        raise ConfigError(
            f"--config-poll {args.config_poll!r}: must be at most {MAX_CONFIG_POLL / 60:g}m"
        )
    return ConfigSource(
        args.config, args.config_configmap, KubeAccess(args.kubeconfig), poll_interval=poll
    )


INPUT_FLAGS = (
    ("--trace", "trace"),
    ("--scaler-config", "scaler_config"),
    ("--pool", "pool"),
    ("--tasks", "tasks"),
    ("--scaled-object", "scaled_object"),
)
"""The flags naming files a run reads, by their ``argparse`` names (``report_directory``)."""


def given_inputs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """The files and directories ``args`` names to be read, with their flags.

    A trace named by scheme (``builtin:``, ``servegen:``) is no path of its own here.
    """
    found: list[tuple[str, Path]] = []
    for flag, name in INPUT_FLAGS:
        value = getattr(args, name, None)
        for item in value if isinstance(value, list) else [value]:
            if item is None or str(item).startswith(("builtin:", "servegen:")):
                continue
            found.append((flag, Path(item)))
    return found


def report_directory(
    path: Path,
    flag: str = "--report",
    outputs: tuple[str, ...] = (),
    inputs: list[tuple[str, Path]] | None = None,
) -> Path:
    """``path`` made (with its parents) and writable, before a run that writes into it.

    A replay wrote its report only at its end: a ``--report`` that was a file, or under
    one, failed after the whole run (74 s for one policy on the built-in day; over an
    hour for every policy on 31 days), the results lost (issue 27, hostile pass 7). Each
    of ``outputs`` (the names the run writes in it) must be a regular file or nothing,
    and none of ``inputs`` (``given_inputs``) may be one of them, or, where the run
    writes a CSV, ``path`` itself (a recording reads every CSV in its directory): a
    directory named ``report.md`` failed after the run; ``tune --scaler-config
    OUT/scaler-config.yaml --out OUT`` removed the config it was given when no trial
    met the target; ``tune --trace REC --out REC`` left its CSVs among a recording's
    (hostile pass 48).

    Raises:
        ConfigError: it cannot be made, no file can be made in it, or an output stands
            where it cannot be replaced or is an input; named.
    """
    import tempfile

    from foundation.files import kind_of

    shown = quote(str(path), 300)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{flag} {shown}: {err.strerror or type(err).__name__}") from err
    try:  # a file made and gone: the permission bits say nothing of root, nor of /proc
        with tempfile.NamedTemporaryFile(dir=path, prefix=".unitscale-"):
            pass
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise ConfigError(f"{flag} {shown}: no file can be made in it ({why})") from err
    for given_flag, given in inputs or []:
        # A recording reads every CSV in its directory; reports and plots it leaves alone.
        if any(name.endswith(".csv") for name in outputs) and _same(given, path):
            raise ConfigError(
                f"{flag} {shown} is the {given_flag} directory: the files written would be"
                " read with it next time"
            )
    for name in outputs:
        target = path / name
        try:
            kind = kind_of(target)
        except OSError as err:
            raise ConfigError(f"{flag} {shown}: {name}: {err.strerror}") from err
        if kind is not None:
            raise ConfigError(f"{flag} {shown}: {name} is {kind}; the run writes a file there")
        for given_flag, given in inputs or []:
            if _same(given, target):
                raise ConfigError(
                    f"{flag} {shown}: {name} is the {given_flag} given, which the run"
                    " replaces: copy it elsewhere first"
                )
    return path


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are the same file or directory (both there)."""
    import os

    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def read_traces(sources: list[str], args: argparse.Namespace) -> list[Trace]:
    """Each ``--trace`` read and scaled by the flags, as one replay's requests in all.

    Raises:
        ConfigError: more than ``MAX_TRACES``, counted before any is read, or more than
            ``MAX_TRACE_REQUESTS`` together, checked as each is read (so at most one trace
            past the bound is ever held).
    """
    from replay.limits import MAX_TRACE_REQUESTS
    from replay.trace import scale
    from replay.workloads import load_trace

    if len(sources) > MAX_TRACES:
        raise ConfigError(f"--trace: {len(sources)} given; at most {MAX_TRACES}")
    traces: list[Trace] = []
    held = 0
    for source in sources:
        trace = scale(
            load_trace(source, args.seed), args.rate_multiplier, args.time_compression, args.seed
        )
        held += len(trace)
        if held > MAX_TRACE_REQUESTS:
            raise ConfigError(
                f"--trace {quote(source)}: {held:,} requests with the traces before it;"
                f" the traces hold at most {MAX_TRACE_REQUESTS:,} in all, as one replay"
            )
        traces.append(trace)
    return traces


def profile(name: str) -> Profile:
    """The replica model called ``name`` (``--profile``)."""
    from foundation.replica_model import PROFILES

    if name not in PROFILES:
        raise ConfigError(f"--profile {name!r}: one of {', '.join(PROFILES)}")
    return PROFILES[name]


# --- serving -------------------------------------------------------------------------------


class Server(Protocol):
    """What a server subcommand runs: every role's server has this shape."""

    async def start(self) -> object: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Server)


def _shutting_down(server: object) -> str:
    return "shutting down"


def serve_until_signal(
    build: Callable[[], Awaitable[S]], farewell: Callable[[S], str] = _shutting_down
) -> int:
    """Build and start a server, serve until SIGTERM or SIGINT, log ``farewell``, stop.

    ``build`` runs on the event loop, where servers bind; a ConfigError it raises (a bad
    config at startup) ends the command with status 2. Returns the exit status, 0.
    """

    async def serve() -> None:
        server = await build()
        await server.start()
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await stopping.wait()
        log.info("%s", farewell(server))
        await server.stop()

    run_async(serve())
    return 0


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where it is installed (about 15% more gRPC calls/s)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.run(main)
    return uvloop.run(main)
