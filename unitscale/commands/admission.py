"""``unitscale admission``: the Kueue admission check (gang fit, data, headroom)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from unitscale import flags
from unitscale.commands.common import kubeconfig_argument, serve_until_signal

if TYPE_CHECKING:
    from admission.app import AdmissionServer
    from unitscale.flags import Commands


def add_command(commands: Commands) -> None:
    """Register ``unitscale admission`` and its flags."""
    admission = commands.add_parser(
        "admission", help="Kueue admission check: GPU gang fit (HAMi), data (Fluid), headroom"
    )
    kubeconfig_argument(admission)
    admission.add_argument(
        "--controller-name",
        help="spec.controllerName of the AdmissionChecks served, also the field manager "
        "(default: the config's, else unitscale.io/capacity)",
    )
    admission.add_argument(
        "--config", type=flags.path, help="admission config YAML (read at start)"
    )
    admission.add_argument(
        "--metrics-listen",
        type=flags.host_port,
        help="HOST:PORT of /metrics and /healthz (default 0.0.0.0:9094)",
    )
    admission.set_defaults(run=run, default_log_level="info")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; a bad config is status 2."""
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

    return serve_until_signal(build)
