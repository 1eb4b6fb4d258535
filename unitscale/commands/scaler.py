"""``unitscale scaler``: the KEDA external scaler (gRPC), its config hot-reloaded."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from foundation.errors import ConfigError
from unitscale import flags
from unitscale.commands.common import (
    config_arguments,
    config_source,
    listen_argument,
    serve_until_signal,
)

if TYPE_CHECKING:
    from scaler.server import ScalerServer
    from unitscale.flags import Commands

log = logging.getLogger("unitscale")


def add_command(commands: Commands) -> None:
    """Register ``unitscale scaler`` and its flags."""
    scaler = commands.add_parser("scaler", help="KEDA external scaler (gRPC)")
    listen_argument(scaler, "--listen", "0.0.0.0:9090", "HOST:PORT")
    config_arguments(scaler, "scaler config YAML (a mounted ConfigMap; hot-reloaded)")
    listen_argument(
        scaler, "--metrics-listen", "0.0.0.0:9092", "Prometheus /metrics of every decision"
    )
    scaler.add_argument("--tls-cert", type=flags.path, help="PEM server certificate (turns on TLS)")
    scaler.add_argument("--tls-key", type=flags.path, help="PEM private key for --tls-cert")
    scaler.add_argument(
        "--tls-client-ca",
        type=flags.path,
        help="PEM CA bundle; clients must present a certificate it signed (mutual TLS)",
    )
    scaler.set_defaults(run=run, default_log_level="info")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; a bad flag or config at startup is status 2."""
    from foundation.kube import KubeAccess
    from scaler.config import parse_config
    from scaler.server import ScalerServer, TlsFiles

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    source = config_source(args)
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None

    async def build() -> ScalerServer:
        # A bad config at startup raises ConfigError here: exit status 2.
        config = parse_config(await source.read(), source.origin)
        server = ScalerServer(
            config,
            args.listen,
            tls,
            source=source,
            metrics_listen=args.metrics_listen,
            # Used only once a ScaledObject names a Fluid Dataset (prewarm).
            kube=KubeAccess(args.kubeconfig),
        )
        # Warned once the TLS files and the address are good: a refusal stays one line.
        if not config.signal_sources and config.demo_source is None:
            log.warning("no signal-sources configured: every KEDA call will get UNAVAILABLE")
        return server

    def farewell(server: ScalerServer) -> str:
        # The grace period in force now: the config may have been reloaded since the start.
        return f"shutting down (grace {server.config.grace_period:.1f}s)"

    return serve_until_signal(build, farewell)
