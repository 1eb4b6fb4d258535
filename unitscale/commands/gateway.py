"""``unitscale gateway``: routing, buffering at zero, activation, sleeping replicas."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from unitscale import flags
from unitscale.commands.common import (
    config_arguments,
    config_source,
    dns_argument,
    listen_argument,
    serve_until_signal,
)

if TYPE_CHECKING:
    from serving.config import GatewayConfig
    from serving.server import GatewayServer
    from unitscale.flags import Commands


def add_command(commands: Commands) -> None:
    """Register ``unitscale gateway`` and its flags."""
    gateway = commands.add_parser("gateway", help="inference gateway: routing, buffering at zero")
    listen_argument(gateway, "--listen", "0.0.0.0:8080", "HTTP")
    listen_argument(gateway, "--grpc-listen", "0.0.0.0:9093", "signals for the scaler")
    gateway.add_argument("--replica", action="append", default=[], metavar="URL", help="repeatable")
    config_arguments(gateway, "gateway config YAML (hot-reloaded)")
    gateway.add_argument("--buffer-timeout", help="Go duration (default 2m)")
    gateway.add_argument("--buffer-size", type=flags.BUFFER_SIZE, help="requests (default 1000)")
    gateway.add_argument("--rate-window", help="Go duration (default 10s)")
    dns_argument(gateway)
    # No defaults here: a flag given overrides the file, one not given leaves it be.
    gateway.add_argument("--namespace", help="the target's namespace (default: default)")
    gateway.add_argument("--deployment", help="the target's deployment (default: default)")
    gateway.set_defaults(run=run, default_log_level="info")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; a bad flag or config at startup is status 2."""
    from serving.config import parse_config
    from serving.server import GatewayServer

    overrides = _overrides(args)
    source = config_source(args)

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

    return serve_until_signal(build)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
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
