"""A deployment's static targets are bounded in the config, as discovery is at runtime.

Issue 27, hostile pass 6 (LOW): ``targets`` took any count (40,000 in a 1 MiB config, 1.3 s
to validate); the runtime then refused the deployment every cycle as more than
``MAX_TARGETS`` to scrape, logged once, publishing nothing. The config is refused instead,
naming the key.
"""

from __future__ import annotations

import pytest

from exporter.config import MAX_TARGETS, MAX_TOTAL_TARGETS
from exporter.config import parse_config as parse_exporter_config
from foundation.errors import ConfigError


def _config(count: int) -> str:
    listed = "".join(f"      - 10.0.{n // 256}.{n % 256}:8000\n" for n in range(count))
    return f"deployments:\n  - deployment: d\n    targets:\n{listed}"


@pytest.mark.parametrize(
    ("count", "taken"),
    [
        pytest.param(MAX_TARGETS, True, id="MAX_TARGETS static targets are taken"),
        pytest.param(MAX_TARGETS + 1, False, id="one more is refused naming targets"),
    ],
)
def test_static_targets_are_bounded(count: int, taken: bool) -> None:
    if taken:
        assert len(parse_exporter_config(_config(count)).deployments[0].targets) == count
    else:
        with pytest.raises(ConfigError, match="targets"):
            parse_exporter_config(_config(count))


def _anchored(deployments: int, per: int) -> str:
    """One YAML anchor of ``per`` targets named by ``deployments`` deployments."""
    listed = "".join(f"    - 10.0.{n // 256}.{n % 256}:8000\n" for n in range(per))
    named = "".join(f"  - deployment: d{i}\n    targets: *all\n" for i in range(1, deployments))
    return f"deployments:\n  - deployment: d0\n    targets: &all\n{listed}{named}"


@pytest.mark.parametrize(
    ("deployments", "taken"),
    [
        pytest.param(4, True, id="four deployments of 1,000 targets are taken"),
        pytest.param(5, False, id="five are refused: 5,000 targets scraped at once"),
    ],
)
def test_the_targets_of_every_deployment_together_are_bounded(
    deployments: int, taken: bool
) -> None:
    """256 deployments naming one anchor of 1,000 targets (46 KB) made 256,000 scrapes
    a cycle: 20,000 file descriptors, 1.16 GB, no cycle ever ended (hostile pass 65)."""
    text = _anchored(deployments, MAX_TARGETS)
    if taken:
        assert len(parse_exporter_config(text).deployments) == deployments
    else:
        with pytest.raises(ConfigError, match=f"{MAX_TOTAL_TARGETS} one exporter scrapes"):
            parse_exporter_config(text)
