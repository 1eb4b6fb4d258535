"""The README and docs/ say what the repository holds.

Facts that have a home in code are checked where they are stated: the trigger metadata
keys and the ScaledObject examples (test_metadata, test_deploy), the policy defaults
(test_defaults), the wheel's top-level names (test_wheel). Here: the README stays short
and keeps its two commands, every link and every named repository path leads somewhere,
and docs/development.md states the import-linter contracts and the import names as
pyproject.toml has them.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Backticked paths under these roots must exist in the working tree.
REPO_ROOTS = (
    "unitscale/",
    "replay/",
    "scaler/",
    "exporter/",
    "serving/",
    "admission/",
    "foundation/",
    "protos/",
    "deploy/",
    "tests/",
    "bench/",
    "tools/",
    "docs/",
    ".ci/",
)


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def prose(path: Path) -> str:
    """The page without its fenced code blocks (commands and YAML, not claims)."""
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.S)


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    block = text.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readme_links_every_doc():
    text = README.read_text()
    for doc in DOCS:
        assert f"]({page_id(doc)})" in text, f"README does not link {page_id(doc)}"


@pytest.mark.parametrize("page", [pytest.param(p, id=page_id(p)) for p in PAGES])
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
        if re.match(r"[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        assert linked.exists(), f"{page_id(page)} links a missing {target}"
        if anchor:
            assert anchor in anchors(linked), f"{page_id(page)}: no heading for {target}"


@pytest.mark.parametrize("page", [pytest.param(p, id=page_id(p)) for p in PAGES])
def test_every_repository_path_named_exists(page):
    named = set(re.findall(r"`([^`\s]+)`", page.read_text()))
    paths = {name for name in named if name.startswith(REPO_ROOTS)}
    assert paths, f"{page_id(page)} names no path at all: is the pattern still right?"
    missing = sorted(name for name in paths if not (ROOT / name.split(":")[0]).exists())
    assert not missing, f"{page_id(page)} names paths that are not there: {missing}"


def development_section(title: str) -> str:
    text = (ROOT / "docs" / "development.md").read_text()
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]
UPDATE = "pyproject.toml's contract changed: say so in docs/development.md's 'Layers'"


def contract_text(name: str) -> str:
    """docs/development.md's paragraph, list or table for one contract."""
    section = development_section("Layers")
    header = f'**Contract "{name}"**'
    assert header in section, f"docs/development.md does not state the contract {name!r}"
    return section.split(header, 1)[1].split("**Contract", 1)[0]


@pytest.mark.parametrize(
    "contract",
    [
        pytest.param(c, id=f"docs/development.md states the contract: {c['name']}")
        for c in CONTRACTS
    ],
)
def test_the_docs_state_every_import_linter_contract(contract):
    text = contract_text(contract["name"])
    if contract["type"] == "layers":
        documented = [
            " | ".join(re.findall(r"`([^`]+)`", line.split("|")[2]))
            for line in text.splitlines()
            if line.startswith("| ") and "`" in line.split("|")[2]
        ]
        assert documented == contract["layers"], UPDATE
    elif contract["type"] == "forbidden":
        sentence = text.split("\n\n", 1)[0]
        assert "import none of" in sentence
        forbidden = re.findall(r"`([^`]+)`", sentence.split("import none of", 1)[1])
        sources = re.findall(r"^- `([^`]+)`$", text, flags=re.M)
        assert sorted(forbidden) == sorted(contract["forbidden_modules"]), UPDATE
        assert sorted(sources) == sorted(contract["source_modules"]), UPDATE
    else:
        pytest.fail(f"a {contract['type']} contract: teach this test to read its docs")


def documented_import_names() -> list[str]:
    section = development_section("Import names")
    return [
        line.split("`")[1]
        for line in section.split("| top-level name |", 1)[1].splitlines()
        if line.startswith("| `")
    ]


def test_the_import_names_are_what_pyproject_packages_and_checks():
    names = documented_import_names()
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(names) == sorted(pattern.removesuffix("*") for pattern in include)
    assert sorted(names) == sorted(PYPROJECT["tool"]["importlinter"]["root_packages"])


def test_every_doc_is_tracked_or_about_to_be():
    """docs/ holds only Markdown the README links (no stray generated files)."""
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--cached", "--exclude-standard", "docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(listed) == sorted(page_id(doc) for doc in DOCS)
