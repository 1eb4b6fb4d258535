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
        assert f'"{param}"' in source, f"{path}::{name} has no case {param!r}"
