"""The one rule for tests that read ``../shared`` (traces, calibration) beside the checkout.

``shared(*parts)`` is the path under it when it exists. When it does not, the test
skips, naming the path it looked for; under ``CI=true`` it fails instead, since CI lays
``shared/`` beside its clone and a missing one there is a broken run, not a reason to
test less.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
"""``shared/`` beside the checkout, as the sessions and CI lay it."""


def shared(*parts: str) -> Path:
    """``SHARED / parts``, or skip (fail under ``CI=true``) naming the missing path."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        message = f"{path} is not there (shared/ beside this checkout)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI=true: {message}")
        pytest.skip(message)
    return path
