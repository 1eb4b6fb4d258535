"""``unitscale exporter``: vLLM/SGLang ``/metrics`` to scaling signals."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from foundation.errors import ConfigError
from unitscale.commands.common import (
    config_arguments,
    config_source,
    dns_argument,
    listen_argument,
    serve_until_signal,
)

if TYPE_CHECKING:
    from exporter.app import ExporterServer
    from exporter.config import ExporterConfig
    from unitscale.flags import Commands


def add_command(commands: Commands) -> None:
    """Register ``unitscale exporter`` and its flags."""
    exporter = commands.add_parser("exporter", help="vLLM/SGLang metrics to scaling signals")
    exporter.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URL",
        help="replica /metrics URL or host:port (repeatable)",
    )
    listen_argument(exporter, "--listen", "0.0.0.0:9100", "HTTP /metrics")
    listen_argument(exporter, "--grpc-listen", "0.0.0.0:9091", "signals gRPC service")
    config_arguments(exporter, "exporter config YAML (a mounted ConfigMap; hot-reloaded)")
    exporter.add_argument(
        "--namespace", help="namespace of the --target or --dns replicas (default: default)"
    )
    exporter.add_argument(
        "--deployment", help="deployment of the --target or --dns replicas (default: default)"
    )
    dns_argument(exporter)
    exporter.add_argument("--interval", help="scrape interval (Go duration, default 5s)")
    exporter.add_argument("--timeout", help="per-scrape timeout (Go duration, default 2s)")
    exporter.set_defaults(run=run, default_log_level="info")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; nothing to scrape, or a bad config at startup, is status 2."""
    from exporter.app import ExporterServer
    from exporter.config import parse_config

    overrides, extra = _flagged(args)
    source = config_source(args)

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

    return serve_until_signal(build)


def _flagged(args: argparse.Namespace) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The config overrides, and the deployment ``--target``/``--dns`` name."""
    overrides: dict[str, object] = {}
    # An empty flag is a value to refuse, not one left out.
    if args.interval is not None:
        overrides["interval"] = args.interval
    if args.timeout is not None:
        overrides["timeout"] = args.timeout
    extra: list[dict[str, object]] = []
    names = {"--namespace": args.namespace, "--deployment": args.deployment}
    named = [flag for flag, value in names.items() if value is not None]
    if named and not (args.target or args.dns):
        # The config file's deployments carry their own names: the flag would be dropped.
        raise ConfigError(f"{named[0]} names the --target or --dns replicas: give one, or drop it")
    if args.target or args.dns:
        flagged: dict[str, object] = {
            "namespace": "default" if args.namespace is None else args.namespace,
            "deployment": "default" if args.deployment is None else args.deployment,
            "targets": args.target,
        }
        if args.dns:
            flagged["dns"] = args.dns
        extra.append(flagged)
    return overrides, extra
