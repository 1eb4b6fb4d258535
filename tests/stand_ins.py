"""Runs stopped as they start: a command's checks, tested without the run behind them."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest


class RanError(Exception):
    """A run started (raised in place of it)."""


def stop_runs(monkeypatch: pytest.MonkeyPatch, runs: Mapping[str, tuple[object, str]]) -> list[str]:
    """Each ``owner.attribute`` of ``runs`` raises ``RanError(name)`` when called, and the
    names called are appended to the list returned, in order."""
    started: list[str] = []

    def stand_in(name: str) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            started.append(name)
            raise RanError(name)

        return run

    for name, (owner, attribute) in runs.items():
        monkeypatch.setattr(owner, attribute, stand_in(name))
    return started
