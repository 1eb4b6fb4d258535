"""``unitscale``: one command, a subcommand per role."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from foundation.errors import ConfigError, UnitscaleError
from unitscale import __version__, flags, tune
from unitscale.flags import Parser, fail

if TYPE_CHECKING:
    from exporter.config import ExporterConfig
    from foundation.reload import ConfigSource
    from foundation.replica_model import Profile
    from replay.pool.cluster import Node, Task
    from replay.pool.joint import Inference, JointOptions
    from replay.run import ReplayOptions
    from replay.simulate import SimConfig
    from replay.trace import Trace
    from scaler.core.model import Policy as CorePolicy
    from scaler.core.tiers import StandbyPolicy

    Commands = argparse._SubParsersAction[Parser]
    """What ``add_subparsers()`` returns: each ``_add_*_command`` adds one to it."""

log = logging.getLogger("unitscale")
T = TypeVar("T")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``unitscale`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, (args.log_level or args.default_log_level).upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.run(args))
    except (UnitscaleError, OSError) as err:
        # The one error path for what the user gave: a flag, a config or trace file, a
        # report directory or a port. One line, status 2; the traceback at debug.
        log.debug("unitscale %s failed", args.command, exc_info=True)
        return fail(args.command, err)
    except KeyboardInterrupt:
        return 130


# --- the command line ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="unitscale", description="Autoscaling and admission for LLM inference.")
    parser.add_argument("--version", action="version", version=f"unitscale {__version__}")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="default: info for servers, warning for the demo (its table is the output)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_scaler_command(commands)
    _add_exporter_command(commands)
    _add_gateway_command(commands)
    _add_sim_replica_command(commands)
    _add_admission_command(commands)
    _add_replay_command(commands)
    tune.add_command(commands)
    _add_demo_command(commands)
    return parser


def _add_scaler_command(commands: Commands) -> None:
    scaler = commands.add_parser("scaler", help="KEDA external scaler (gRPC)")
    _listen_argument(scaler, "--listen", "0.0.0.0:9090", "HOST:PORT")
    _config_arguments(scaler, "scaler config YAML (a mounted ConfigMap; hot-reloaded)")
    _listen_argument(
        scaler, "--metrics-listen", "0.0.0.0:9092", "Prometheus /metrics of every decision"
    )
    scaler.add_argument("--tls-cert", type=Path, help="PEM server certificate (turns on TLS)")
    scaler.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    scaler.add_argument(
        "--tls-client-ca",
        type=Path,
        help="PEM CA bundle; clients must present a certificate it signed (mutual TLS)",
    )
    scaler.set_defaults(run=_run_scaler, default_log_level="info")


def _add_exporter_command(commands: Commands) -> None:
    exporter = commands.add_parser("exporter", help="vLLM/SGLang metrics to scaling signals")
    exporter.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URL",
        help="replica /metrics URL or host:port (repeatable)",
    )
    _listen_argument(exporter, "--listen", "0.0.0.0:9100", "HTTP /metrics")
    _listen_argument(exporter, "--grpc-listen", "0.0.0.0:9091", "signals gRPC service")
    _config_arguments(exporter, "exporter config YAML (a mounted ConfigMap; hot-reloaded)")
    exporter.add_argument("--namespace", default="default", help="namespace of --target replicas")
    exporter.add_argument("--deployment", default="default", help="deployment of --target replicas")
    _dns_argument(exporter)
    exporter.add_argument("--interval", help="scrape interval (Go duration, default 5s)")
    exporter.add_argument("--timeout", help="per-scrape timeout (Go duration, default 2s)")
    exporter.set_defaults(run=_run_exporter, default_log_level="info")


def _add_gateway_command(commands: Commands) -> None:
    gateway = commands.add_parser("gateway", help="inference gateway: routing, buffering at zero")
    _listen_argument(gateway, "--listen", "0.0.0.0:8080", "HTTP")
    _listen_argument(gateway, "--grpc-listen", "0.0.0.0:9093", "signals for the scaler")
    gateway.add_argument("--replica", action="append", default=[], metavar="URL", help="repeatable")
    _config_arguments(gateway, "gateway config YAML (hot-reloaded)")
    gateway.add_argument("--buffer-timeout", help="Go duration (default 2m)")
    gateway.add_argument("--buffer-size", type=int, help="requests (default 1000)")
    gateway.add_argument("--rate-window", help="Go duration (default 10s)")
    _dns_argument(gateway)
    # No defaults here: a flag given overrides the file, one not given leaves it be.
    gateway.add_argument("--namespace", help="the target's namespace (default: default)")
    gateway.add_argument("--deployment", help="the target's deployment (default: default)")
    gateway.set_defaults(run=_run_gateway, default_log_level="info")


def _add_sim_replica_command(commands: Commands) -> None:
    sim = commands.add_parser("sim-replica", help="a vLLM-compatible simulated replica")
    _listen_argument(sim, "--listen", "127.0.0.1:8000", "HTTP")
    sim.add_argument("--profile", default="llama3-8b-h200")
    sim.add_argument("--model", default="sim-llama", help="served model name")
    sim.add_argument(
        "--speedup",
        type=flags.TIME_COMPRESSION,
        default=1.0,
        help="run engine steps this much faster",
    )
    sim.add_argument(
        "--max-num-batched-tokens",
        type=flags.BATCHED_TOKENS,
        help="chunked-prefill budget per step, as vLLM's flag (default: the profile's)",
    )
    sim.set_defaults(run=_run_sim_replica, default_log_level="info")


def _add_admission_command(commands: Commands) -> None:
    admission = commands.add_parser(
        "admission", help="Kueue admission check: GPU gang fit (HAMi), data (Fluid), headroom"
    )
    admission.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig for API access (default: in-cluster service account when in a "
        "pod, else $KUBECONFIG or ~/.kube/config)",
    )
    admission.add_argument(
        "--controller-name",
        help="spec.controllerName of the AdmissionChecks served, also the field manager "
        "(default: the config's, else unitscale.io/capacity)",
    )
    admission.add_argument("--config", type=Path, help="admission config YAML (read at start)")
    admission.add_argument(
        "--metrics-listen", help="HOST:PORT of /metrics and /healthz (default 0.0.0.0:9094)"
    )
    admission.set_defaults(run=_run_admission, default_log_level="info")


def _add_replay_command(commands: Commands) -> None:
    replay = commands.add_parser("replay", help="simulate a vLLM fleet under KEDA for every policy")
    replay.add_argument(
        "--trace",
        action="append",
        help="Azure LLM CSV, Mooncake JSONL, builtin:business-day|business-days|business-week,"
        " or servegen:DIR?scale=X&days=A-B (replay.workloads);"
        " with --pool repeatable, one inference deployment each (default builtin:business-day)",
    )
    replay.add_argument("--policy", default="all", help="a policy name or 'all'")
    replay.add_argument("--rate-multiplier", type=flags.RATE_MULTIPLIER, default=1.0)
    replay.add_argument("--time-compression", type=flags.TIME_COMPRESSION, default=1.0)
    replay.add_argument("--profile", default="llama3-8b-h200")
    replay.add_argument(
        "--price", type=flags.PRICE, help="US$ per accelerator-hour (default: the profile's)"
    )
    replay.add_argument(
        "--slo-ttft", type=flags.SLO_SECONDS, default=2.0, help="seconds (default 2)"
    )
    replay.add_argument(
        "--slo-itl",
        type=flags.SLO_SECONDS,
        default=0.1,
        help="mean inter-token seconds (default 0.1)",
    )
    _cold_start_argument(replay)
    replay.add_argument(
        "--prewarm", action="store_true", help="Fluid prewarm: every start is cached"
    )
    replay.add_argument(
        "--compare-tiers",
        action="store_true",
        help="unitscale from cold, cache-warm and sleeping replicas, and always on (1)",
    )
    replay.add_argument(
        "--max-sleeping",
        type=flags.SLEEPING,
        default=4,
        help="with --compare-tiers (default 4)",
    )
    replay.add_argument(
        "--idle-grace",
        type=flags.IDLE_GRACE,
        help="with --compare-tiers: seconds without a request before unitscale scales to zero",
    )
    replay.add_argument("--max-replicas", type=flags.REPLICAS, default=64)
    replay.add_argument("--target-concurrency", type=flags.CONCURRENCY, default=32.0)
    replay.add_argument("--seed", type=flags.SEED, default=0)
    replay.add_argument(
        "--scaler-config",
        type=Path,
        help="the scaler's ConfigMap YAML to try: its policy section drives the unitscale policy",
    )
    replay.add_argument("--report", type=Path, required=True, help="output directory")
    _joint_arguments(replay)
    replay.set_defaults(run=_run_replay, default_log_level="warning")


def _joint_arguments(replay: argparse.ArgumentParser) -> None:
    """The joint replay's flags (``--pool``): one pool shared by training and inference."""
    joint = replay.add_argument_group("joint replay (one pool, training and inference)")
    joint.add_argument(
        "--pool",
        type=Path,
        metavar="NODES_CSV",
        help="Alibaba openb node list: run the joint replay",
    )
    joint.add_argument(
        "--tasks", type=Path, metavar="PODS_CSV", help="openb pod list (with --pool)"
    )
    joint.add_argument(
        "--pool-fraction",
        type=flags.SHARE,
        default=0.03,
        help="share of the nodes and tasks kept, stratified by model (default %(default)s; 1: all)",
    )
    joint.add_argument(
        "--training-load",
        type=flags.TRAINING_LOAD,
        default=1.0,
        help="offered training load as a share of the cards inference leaves on average"
        " (default %(default)s)",
    )
    joint.add_argument(
        "--placement",
        action="append",
        choices=["binpack", "spread", "fgd"],
        help="repeatable; the manager runs with each, static and kueue with the first"
        " (default binpack, spread, fgd)",
    )
    joint.add_argument(
        "--inference-gpu-type", help="node model inference replicas need (default any)"
    )
    joint.add_argument(
        "--headroom",
        type=flags.HEADROOM,
        action="append",
        metavar="FRACTION",
        help="repeatable: the manager runs with each burst headroom, a share of inference's"
        " forecast its allowance keeps free (ManagerPolicy.headroom_fraction; default 0)",
    )
    joint.add_argument(
        "--fgd-mix",
        choices=["joint", "training"],
        default="joint",
        help="FGD's target workload: training's tasks and inference's replicas by arrivals,"
        " or training's alone (default %(default)s)",
    )
    joint.add_argument(
        "--warm-start",
        action="store_true",
        help="start each Deployment with the replicas its first interval needs, as"
        " unitscale replay does (fits the instant bound per trace first; default cold)",
    )
    joint.add_argument(
        "--max-task-seconds",
        type=flags.TASK_SECONDS,
        default=1800.0,
        help="training durations are capped at this (default %(default)s)",
    )


def _add_demo_command(commands: Commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="local end-to-end demo: gateway, replicas, exporter, scaler, KEDA, a trace",
    )
    demo.add_argument(
        "--duration",
        type=flags.DEMO_SECONDS,
        default=180.0,
        help="wall seconds of trace (default 180)",
    )
    demo.add_argument(
        "--time-compression",
        type=flags.TIME_COMPRESSION,
        help="trace seconds per wall second, for every clock (default 10; 1 with --real-vllm)",
    )
    demo.add_argument(
        "--trace", type=Path, help="Azure LLM CSV or Mooncake JSONL (default: built-in workload)"
    )
    demo.add_argument(
        "--rate-multiplier", type=flags.RATE_MULTIPLIER, default=1.0, help="for --trace"
    )
    demo.add_argument(
        "--real-vllm", action="store_true", help="real vLLM for CPUs replicas (tiny model)"
    )
    demo.add_argument("--seed", type=flags.SEED, default=0)
    demo.add_argument("--profile", default="qwen2.5-32b-h200", help="simulated replica model")
    demo.add_argument(
        "--max-replicas", type=flags.DEMO_REPLICAS, help="default 8 simulated, 2 with --real-vllm"
    )
    demo.add_argument(
        "--target-concurrency",
        type=flags.CONCURRENCY,
        default=16.0,
        help="the trigger's targetConcurrency",
    )
    _cold_start_argument(demo)
    demo.add_argument(
        "--no-standby",
        dest="standby",
        action="store_false",
        help="no sleeping replicas: every return from zero waits out a cold start"
        " (the default holds them as the trigger's standby: true; off with --real-vllm)",
    )
    demo.add_argument(
        "--scaled-object",
        type=Path,
        help="ScaledObject YAML (default deploy/scaledobjects/recommended.yaml)",
    )
    demo.add_argument("--scaler-config", type=Path, help="the scaler's ConfigMap YAML to try")
    demo.add_argument("--plain", action="store_true", help="log lines instead of the live panel")
    demo.add_argument(
        "--report",
        type=Path,
        default=Path("demo-report"),
        help="output directory (default %(default)s)",
    )
    demo.set_defaults(run=_run_demo, default_log_level="warning")


def _listen_argument(command: argparse.ArgumentParser, flag: str, default: str, what: str) -> None:
    """A ``HOST:PORT`` to serve ``what`` on."""
    command.add_argument(flag, default=default, help=f"{what} (default %(default)s)")


def _config_arguments(command: argparse.ArgumentParser, config_help: str) -> None:
    """Where a server's hot-reloaded config comes from: ``_config_source`` reads them."""
    command.add_argument("--config", type=Path, help=config_help)
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
    command.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig for API access (default: in-cluster service account when in a "
        "pod, else $KUBECONFIG or ~/.kube/config)",
    )


def _dns_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--dns", help="host:port of a headless Service: every A record a replica")


def _cold_start_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--cold-start", default="local-disk", help="cached | local-disk | remote | new-node"
    )


def _config_source(args: argparse.Namespace) -> ConfigSource:
    from foundation.durations import parse_duration
    from foundation.kube import KubeAccess
    from foundation.reload import ConfigSource

    try:
        poll = parse_duration(args.config_poll)
    except ValueError as err:
        raise ConfigError(f"--config-poll {args.config_poll!r}: {err}") from err
    if poll <= 0:
        raise ConfigError(f"--config-poll {args.config_poll!r}: must be positive")
    return ConfigSource(
        args.config, args.config_configmap, KubeAccess(args.kubeconfig), poll_interval=poll
    )


# --- the servers ---------------------------------------------------------------------------


class _Server(Protocol):
    """What a server subcommand runs: every role's server has this shape."""

    async def start(self) -> object: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=_Server)


def _shutting_down(server: object) -> str:
    return "shutting down"


def _serve_until_signal(
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

    _run_async(serve())
    return 0


def _run_scaler(args: argparse.Namespace) -> int:
    from foundation.kube import KubeAccess
    from scaler.config import parse_config
    from scaler.server import ScalerServer, TlsFiles

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    source = _config_source(args)
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None

    async def build() -> ScalerServer:
        # A bad config at startup raises ConfigError here: exit status 2.
        config = parse_config(await source.read(), source.origin)
        if not config.signal_sources and config.demo_source is None:
            log.warning("no signal-sources configured: every KEDA call will get UNAVAILABLE")
        return ScalerServer(
            config,
            args.listen,
            tls,
            source=source,
            metrics_listen=args.metrics_listen,
            # Used only once a ScaledObject names a Fluid Dataset (prewarm).
            kube=KubeAccess(args.kubeconfig),
        )

    def farewell(server: ScalerServer) -> str:
        # The grace period in force now: the config may have been reloaded since the start.
        return f"shutting down (grace {server.config.grace_period:.1f}s)"

    return _serve_until_signal(build, farewell)


def _run_exporter(args: argparse.Namespace) -> int:
    from exporter.app import ExporterServer
    from exporter.config import parse_config

    overrides, extra = _exporter_flags(args)
    source = _config_source(args)

    def parse(text: str, origin: str) -> ExporterConfig:
        # Flags win over the file at startup and on every reload.
        return parse_config(text, origin, overrides, extra)

    async def build() -> ExporterServer:
        config = parse(await source.read(), source.origin)
        if not config.deployments:
            raise ConfigError(
                "nothing to scrape: give --target URL, --dns HOST:PORT or deployments in --config"
            )
        return ExporterServer(
            config, args.listen, args.grpc_listen, source=source, parse=parse, kube=source.kube
        )

    return _serve_until_signal(build)


def _exporter_flags(
    args: argparse.Namespace,
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The exporter's config overrides, and the deployment ``--target``/``--dns`` name."""
    overrides: dict[str, object] = {}
    if args.interval:
        overrides["interval"] = args.interval
    if args.timeout:
        overrides["timeout"] = args.timeout
    extra: list[dict[str, object]] = []
    if args.target or args.dns:
        flagged: dict[str, object] = {
            "namespace": args.namespace,
            "deployment": args.deployment,
            "targets": args.target,
        }
        if args.dns:
            flagged["dns"] = args.dns
        extra.append(flagged)
    return overrides, extra


def _run_gateway(args: argparse.Namespace) -> int:
    from serving.config import GatewayConfig, parse_config
    from serving.server import GatewayServer

    overrides = _gateway_overrides(args)
    source = _config_source(args)

    def parse(text: str, origin: str) -> GatewayConfig:
        return parse_config(text, origin, overrides)

    async def build() -> GatewayServer:
        config = parse(await source.read(), source.origin)
        return GatewayServer(
            config.replicas,
            config.settings(),
            args.listen,
            args.grpc_listen,
            config=config,
            source=source,
            parse=parse,
            kube=source.kube,
        )

    return _serve_until_signal(build)


def _gateway_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The flags given: they win over the file, at start and on every reload."""
    return {
        key: value
        for key, value in (
            ("replicas", args.replica or None),
            ("buffer-timeout", args.buffer_timeout),
            ("buffer-size", args.buffer_size),
            ("rate-window", args.rate_window),
            ("dns", args.dns),
            ("namespace", args.namespace),
            ("deployment", args.deployment),
        )
        if value is not None
    }


def _run_sim_replica(args: argparse.Namespace) -> int:
    from serving.server import SimReplicaServer

    profile = _profile(args.profile)
    if args.max_num_batched_tokens is not None:
        if args.max_num_batched_tokens < profile.max_num_seqs:
            raise ConfigError(
                f"--max-num-batched-tokens {args.max_num_batched_tokens}: at least"
                f" max_num_seqs ({profile.max_num_seqs}), as vLLM requires"
            )
        profile = dataclasses.replace(profile, max_num_batched_tokens=args.max_num_batched_tokens)

    async def build() -> SimReplicaServer:
        return SimReplicaServer(profile, args.listen, args.model, args.speedup)

    return _serve_until_signal(build)


def _run_admission(args: argparse.Namespace) -> int:
    from admission.app import AdmissionServer, configure_logging
    from admission.config import load_config
    from foundation.kube import KubeAccess

    overrides = {
        key: value
        for key, value in (
            ("controller-name", args.controller_name),
            ("metrics-listen", args.metrics_listen),
        )
        if value is not None
    }
    config = load_config(args.config, overrides)
    configure_logging(config, keep_level=args.log_level is not None)

    async def build() -> AdmissionServer:
        return AdmissionServer(config, KubeAccess(args.kubeconfig))

    return _serve_until_signal(build)


def _profile(name: str) -> Profile:
    """The replica model called ``name`` (``--profile``)."""
    from foundation.replica_model import PROFILES

    if name not in PROFILES:
        raise ConfigError(f"--profile {name!r}: one of {', '.join(PROFILES)}")
    return PROFILES[name]


# --- the tools -----------------------------------------------------------------------------


def _run_replay(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from replay.run import TIER_COLUMNS, compare_tiers, run_policies, tier_notes, write_report
    from replay.trace import scale
    from replay.workloads import load_trace

    if args.pool is not None or args.tasks is not None:
        return _run_joint_replay(args)
    if not args.trace or len(args.trace) > 1:
        raise ConfigError("--trace: give exactly one (several only with --pool)")
    config, names = _replay_config(args)
    trace = scale(
        load_trace(args.trace[0], args.seed), args.rate_multiplier, args.time_compression, args.seed
    )
    options = _replay_options(args)
    with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("replay", total=trace.duration)

        def progress(name: str, now: float) -> None:
            bar.update(task, completed=now, description=name)

        if args.compare_tiers:
            grace = {} if args.idle_grace is None else {"idleGrace": f"{args.idle_grace:g}s"}
            results = compare_tiers(trace, config, options, _standby(args), progress, grace)
        else:
            results = run_policies(trace, names, config, options, progress)
    if args.compare_tiers:
        notes = tuple(tier_notes(config))
        write_report(results, config, options, args.report, TIER_COLUMNS, notes)
    else:
        write_report(results, config, options, args.report)
    print((args.report / "report.md").read_text())
    return 0


def _replay_config(args: argparse.Namespace) -> tuple[SimConfig, list[str]]:
    """The simulated fleet and the policies to replay, from checked flags."""
    from replay.run import POLICIES

    names = list(POLICIES) if args.policy == "all" else [args.policy]
    config = flags.fleet_of(args)
    if any(n not in POLICIES for n in names):
        raise ConfigError(f"--policy {args.policy!r}: one of {', '.join(POLICIES)} or all")
    return config, names


def _standby(args: argparse.Namespace) -> StandbyPolicy:
    """The standby plan's knobs for ``--compare-tiers``."""
    from scaler.core.tiers import StandbyPolicy

    if args.policy != "all":
        raise ConfigError("--compare-tiers runs the unitscale policy in every row: drop --policy")
    return StandbyPolicy(max_sleeping=args.max_sleeping)


def _replay_options(args: argparse.Namespace) -> ReplayOptions:
    """The run's settings, the unitscale policy's from ``--scaler-config``."""
    from replay.run import ReplayOptions
    from scaler.config import load_config as load_scaler_config

    scaler_config = load_scaler_config(args.scaler_config)
    return ReplayOptions(
        str(args.trace[0]),
        args.rate_multiplier,
        args.time_compression,
        args.seed,
        args.target_concurrency,
        policy=scaler_config.policy_defaults(),
    )


def _run_joint_replay(args: argparse.Namespace) -> int:
    """``replay --pool``: every baseline on one pool, one progress bar over simulated time."""
    from rich.progress import Progress

    from replay.pool.joint import run_all
    from replay.pool.report import write_report

    nodes, tasks, deployments, options = _joint_inputs(args)
    horizon = max(d.horizon for d in deployments)
    total = horizon * (1 + len(options.configs((0,) * len(deployments))))
    with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("joint replay", total=total)

        def progress(name: str, done: float) -> None:
            bar.update(task, completed=done, description=name)

        run = run_all(nodes, tasks, deployments, options, progress)
    profile = deployments[0].config.profile
    notes = (
        f"- inference: {', '.join(d.name for d in deployments)} under the unitscale scaler;"
        f" every replica is the {profile.name} calibration (${profile.price_per_hour:.2f}"
        " per accelerator-hour), whatever GPU model of the trace's nodes it lands on",
        f"- training: `{args.tasks.name}`, durations capped at {options.duration_cap:g} s;"
        f" nodes `{args.pool.name}` at fraction {args.pool_fraction:g}",
    )
    write_report(run, args.report, notes)
    print((args.report / "report.md").read_text())
    return 0


def _joint_inputs(
    args: argparse.Namespace,
) -> tuple[tuple[Node, ...], tuple[Task, ...], list[Inference], JointOptions]:
    """The pool's nodes, the tasks, the inference deployments and the options, checked."""
    from replay.pool.cluster import read_nodes, read_tasks
    from replay.pool.joint import Inference, JointOptions
    from replay.trace import scale
    from replay.workloads import load_trace

    if args.pool is None or args.tasks is None:
        raise ConfigError("--pool NODES_CSV and --tasks PODS_CSV go together")
    if args.compare_tiers or args.policy != "all":
        raise ConfigError("--pool runs the unitscale scaler in every deployment: drop --policy")
    try:
        nodes = read_nodes(args.pool, args.pool_fraction)
        tasks = read_tasks(args.tasks, args.pool_fraction)
    except (OSError, ValueError) as err:
        raise ConfigError(str(err)) from err
    config, _ = _replay_config(args)
    policy = _replay_options_policy(args)
    # as unitscale replay: the scaler plans with the simulated model (--profile) unless
    # the scaler config names one
    profile = config.profile.name if policy.profile is None else None
    deployments: list[Inference] = []
    for source in args.trace or ["builtin:business-day"]:
        trace = scale(
            load_trace(source, args.seed), args.rate_multiplier, args.time_compression, args.seed
        )
        name = f"{trace.name}-{len(deployments)}" if len(args.trace or ()) > 1 else trace.name
        initial = _joint_warm_start(args, source, trace, config) if args.warm_start else 0
        deployments.append(
            Inference(
                name,
                trace,
                config,
                args.target_concurrency,
                args.max_replicas,
                policy,
                profile,
                initial_replicas=initial,
            )
        )
    options = JointOptions(
        placements=tuple(args.placement or ("binpack", "spread", "fgd")),
        training_load=args.training_load,
        duration_cap=args.max_task_seconds,
        inference_gpu_type=args.inference_gpu_type,
        headrooms=tuple(args.headroom or ()),
        mix=args.fgd_mix,
    )
    return nodes, tasks, deployments, options


def _joint_warm_start(
    args: argparse.Namespace, source: str, trace: Trace, config: SimConfig
) -> int:
    """The replicas ``unitscale replay`` starts this trace's policies with."""
    from replay.oracle import find_instant_bound
    from replay.run import ReplayOptions, warm_replicas

    _, schedule = find_instant_bound(trace, config)
    options = ReplayOptions(source, args.rate_multiplier, args.time_compression, args.seed)
    return warm_replicas(schedule, config, options)


def _replay_options_policy(args: argparse.Namespace) -> CorePolicy:
    """The unitscale policy section of ``--scaler-config`` (defaults without one)."""
    from scaler.config import load_config as load_scaler_config

    return load_scaler_config(args.scaler_config).policy_defaults()


def _run_demo(args: argparse.Namespace) -> int:
    import os

    # Children are exec'd at once: gRPC's fork handlers would only log that they skip.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from unitscale.demo import DemoOptions, run_demo

    options = DemoOptions(
        report=args.report,
        duration=args.duration,
        time_compression=args.time_compression,
        trace=args.trace,
        rate_multiplier=args.rate_multiplier,
        real_vllm=args.real_vllm,
        seed=args.seed,
        profile=args.profile,
        max_replicas=args.max_replicas,
        target_concurrency=args.target_concurrency,
        cold_start=args.cold_start,
        standby=args.standby,
        live_view=False if args.plain else None,
        command="unitscale " + " ".join(sys.argv[1:]),
        **({"scaled_object": args.scaled_object} if args.scaled_object else {}),
        scaler_config=args.scaler_config,
    )
    return _run_async(run_demo(options))


def _run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where it is installed (about 15% more gRPC calls/s)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.run(main)
    return uvloop.run(main)


if __name__ == "__main__":
    sys.exit(main())
