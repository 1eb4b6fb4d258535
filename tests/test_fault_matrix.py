"""docs/faults.md names only tests that exist: the matrix cannot drift from the suite."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MATRIX = (ROOT / "docs" / "faults.md").read_text()
LEGEND = dict(re.findall(r"`(\w+)` = `(tests/[\w/]+\.py)`", MATRIX))
CITED = re.compile(r"(tests/[\w/]+\.py|\b[A-Z]{1,2})::(test_\w+)(?:\[([^\]]+)\])?")


def cited() -> list[tuple[str, str, str | None]]:
    """(file, test, parameter id or None) for every test the matrix cites."""
    rows = [line for line in MATRIX.splitlines() if line.startswith("| ") and "::" in line]
    found = [m for row in rows for m in CITED.finditer(row.split(" | ")[-1])]
    out: list[tuple[str, str, str | None]] = []
    for m in found:
        where: str = m.group(1)
        out.append((LEGEND.get(where) or where, m.group(2), m.group(3)))
    return out


def named_case(source: str, param: str) -> bool:
    """Whether ``param`` is a case id of ``source``: one quoted id, or stacked parametrize ids
    that pytest joined with '-' (each part quoted in the source)."""
    if f'"{param}"' in source:
        return True
    cuts = [i for i, c in enumerate(param) if c == "-"]
    return any(
        f'"{param[:cut]}"' in source and named_case(source, param[cut + 1 :]) for cut in cuts
    )


@pytest.mark.parametrize(
    ("param", "named"),
    [
        pytest.param("one case", True, id="a quoted id is a case"),
        pytest.param("one case-tune", True, id="stacked ids joined by a dash are a case"),
        pytest.param("one-dash-tune", True, id="an id holding a dash still splits right"),
        pytest.param("one case-other", False, id="a part not in the source is no case"),
        pytest.param("no case", False, id="an id not in the source is no case"),
    ],
)
def test_a_cited_case_is_found_in_stacked_parametrize_ids(param: str, named: bool):
    source = 'ids = ["one case", "tune", "one-dash"]'
    assert named_case(source, param) is named


def test_the_matrix_cites_tests_from_every_part():
    files = {path for path, _, _ in cited()}
    assert len(cited()) > 50 and len(files) > 10


@pytest.mark.parametrize(("path", "name", "param"), cited(), ids=lambda v: str(v))
def test_every_cited_test_exists(path, name, param):
    source = (ROOT / path).read_text()
    tests = {
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert name in tests, f"{path} has no {name}"
    if param is not None:
        assert named_case(source, param), f"{path}::{name} has no case {param!r}"
