"""What several subcommands share: listen and config flags, serving until a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from foundation.errors import ConfigError, quote
from unitscale import flags

if TYPE_CHECKING:
    from foundation.reload import ConfigSource
    from foundation.replica_model import Profile
    from replay.trace import Trace

log = logging.getLogger("unitscale")
T = TypeVar("T")

CONFIG_POLL = "1s"
"""How often ``--config`` is checked for changes by default."""
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
        metavar="DURATION",
        help=f"how often --config is checked for changes (Go duration, default {CONFIG_POLL})",
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

    if args.config_poll is not None and args.config is None:
        # A ConfigMap is watched, and without either there is nothing to check.
        raise ConfigError("--config-poll is how often --config is read: give --config, or drop it")
    text = CONFIG_POLL if args.config_poll is None else args.config_poll
    try:
        poll = parse_duration(text)
    except ValueError as err:
        raise ConfigError(f"--config-poll {text!r}: {err}") from err
    if not poll >= MIN_CONFIG_POLL:
        raise ConfigError(f"--config-poll {text!r}: must be at least {MIN_CONFIG_POLL * 1000:g}ms")
    if poll > MAX_CONFIG_POLL:
        raise ConfigError(f"--config-poll {text!r}: must be at most {MAX_CONFIG_POLL / 60:g}m")
    return ConfigSource(
        args.config, args.config_configmap, KubeAccess(args.kubeconfig), poll_interval=poll
    )


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
