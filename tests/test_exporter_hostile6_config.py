"""A deployment's static targets are bounded in the config, as discovery is at runtime.

Issue 27, hostile pass 6 (LOW): ``targets`` took any count (40,000 in a 1 MiB config, 1.3 s
to validate); the runtime then refused the deployment every cycle as more than
``MAX_TARGETS`` to scrape, logged once, publishing nothing. The config is refused instead,
naming the key.
"""

from __future__ import annotations

import pytest

from exporter.config import MAX_TARGETS
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
