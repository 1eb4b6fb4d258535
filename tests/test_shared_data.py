"""The rule for tests that read ``../shared``: skip naming the path, fail under CI=true."""

from __future__ import annotations

import pytest

from tests.shared_data import SHARED, shared


def test_a_present_path_is_returned():
    assert shared() == SHARED or not SHARED.exists()


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [
        pytest.param(None, pytest.skip.Exception, id="outside CI a missing file skips"),
        pytest.param("false", pytest.skip.Exception, id="CI=false skips too"),
        pytest.param("true", pytest.fail.Exception, id="under CI=true a missing file fails"),
    ],
)
def test_a_missing_path_is_named(monkeypatch, ci, outcome):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"no-such-trace\.csv is not there"):
        shared("traces", "no-such-trace.csv")
