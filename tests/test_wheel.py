"""The wheel, as a user gets it: built, installed alone into a fresh venv, run from elsewhere.

1. The build reads a clean copy of the source tree (pyproject.toml, README.md and every
   top-level package folder) in a temporary folder, so a stale ``build/`` or egg-info in
   the work tree cannot leak into the wheel. It uses the ``.venv``'s setuptools (no build
   isolation: the build needs nothing from the network, and that setuptools satisfies
   ``[build-system]``).
2. The fresh venv has no site-packages but its own (not ``--system-site-packages``: the
   ``.venv`` holds unitscale itself, installed editable, and its import hook would serve
   the source tree). The wheel is installed with its declared dependencies from the
   package index, pinned to the versions the ``.venv`` holds (a dependency missing from
   ``pyproject.toml`` fails here), by the ``.venv``'s pip (``pip --python``).
3. From a folder outside the repository, with ``-I`` (no cwd, no PYTHONPATH, no user
   site): ``unitscale --help`` through the console script, and every module the wheel
   holds imported, each from the fresh venv.
4. The wheel's top-level names are the ones docs/development.md lists ("Import names"),
   and it holds every Python file of those packages' source folders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.test_docs import documented_import_names

ROOT = Path(__file__).parent.parent
BUILD_FILES = ("pyproject.toml", "README.md", "setup.py", "setup.cfg", "MANIFEST.in")

# Run inside the fresh venv: import every module of the installed distribution.
IMPORT_ALL = r"""
import importlib, json, sys, sysconfig
from importlib import metadata
site = sysconfig.get_paths()["purelib"]
modules = sorted(
    ".".join(p.with_suffix("").parts).removesuffix(".__init__")
    for p in (f for f in metadata.files("unitscale") if f.suffix == ".py")
)
report = {"prefix": sys.prefix, "site": site, "modules": modules, "failed": {}, "outside": {}}
for name in modules:
    try:
        module = importlib.import_module(name)
    except Exception as err:
        report["failed"][name] = f"{type(err).__name__}: {err}"
        continue
    if not (module.__file__ or "").startswith(site):
        report["outside"][name] = module.__file__
print(json.dumps(report))
"""


def copy_source(to: Path) -> Path:
    to.mkdir()
    for name in BUILD_FILES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, to / name)
    for folder in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
        shutil.copytree(
            folder, to / folder.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    return to


def run(command: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, command))} exited {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def pins(wheel: Path) -> list[str]:
    """The wheel's dependencies at the versions this suite runs against."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(name).decode()
    pinned = []
    for line in re.findall(r"^Requires-Dist: (.+)$", text, flags=re.M):
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            pinned.append(f"{requirement.name}=={metadata.version(requirement.name)}")
    assert pinned, "the wheel declares no dependencies: is METADATA still read right?"
    return pinned


def clean_env(venv: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.mark.timeout(420)
def test_the_wheel_installs_into_a_fresh_venv_and_runs_from_anywhere(tmp_path):
    source = copy_source(tmp_path / "source")
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, source], tmp_path)
    (wheel,) = dist.glob("unitscale-*.whl")

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert sorted(top_level) == sorted(documented_import_names()), (
        "the wheel's top-level names differ from docs/development.md's 'Import names':"
        " a new top-level name is a decision, see there"
    )
    for package in sorted(top_level):
        for path in sorted((source / package).rglob("*.py")):
            assert path.relative_to(source).as_posix() in names, f"the wheel lacks {path}"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    python = venv / "bin" / "python"
    run([*pip, "--python", python, "install", "-q", wheel, *pins(wheel)], tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env(venv)
    usage = run([venv / "bin" / "unitscale", "--help"], elsewhere, env)
    assert usage.startswith("usage: unitscale")
    for command in ("scaler", "exporter", "gateway", "sim-replica", "admission", "replay", "demo"):
        assert command in usage
    version = run([venv / "bin" / "unitscale", "--version"], elsewhere, env)
    assert metadata.version("unitscale") in version

    report = json.loads(run([python, "-I", "-c", IMPORT_ALL], elsewhere, env))
    assert Path(report["prefix"]) == venv
    assert {m.split(".")[0] for m in report["modules"]} == top_level
    assert report["failed"] == {}, "modules of the wheel that do not import"
    assert report["outside"] == {}, "modules imported from outside the fresh venv"
