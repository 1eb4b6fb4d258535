"""The directory a command writes its files into, checked before the run.

A run that writes its report only at its end must not find out then that it cannot:
the directory is made and written to first, each file the run will write must be a
regular file or nothing, and none may be a file the run reads (``report_directory``).
The files themselves are written by ``foundation.files.write_file``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from foundation.errors import ConfigError, quote
from foundation.files import kind_of

INPUT_FLAGS = (
    ("--trace", "trace"),
    ("--scaler-config", "scaler_config"),
    ("--pool", "pool"),
    ("--tasks", "tasks"),
    ("--scaled-object", "scaled_object"),
)
"""The flags naming files a run reads, by their ``argparse`` names (``report_directory``)."""


def given_inputs(args: object) -> list[tuple[str, Path]]:
    """The files and directories ``args`` (flags, or options named alike) names to be read.

    A trace named by scheme (``builtin:``, ``servegen:``) is no path of its own here.
    """
    found: list[tuple[str, Path]] = []
    for flag, name in INPUT_FLAGS:
        value = getattr(args, name, None)
        for item in value if isinstance(value, list) else [value]:
            if item is None or str(item).startswith(("builtin:", "servegen:")):
                continue
            found.append((flag, Path(item)))
    return found


def report_directory(
    path: Path,
    flag: str = "--report",
    outputs: tuple[str, ...] = (),
    inputs: list[tuple[str, Path]] | None = None,
) -> Path:
    """``path`` made (with its parents) and writable, before a run that writes into it.

    A replay wrote its report only at its end: a ``--report`` that was a file, or under
    one, failed after the whole run (74 s for one policy on the built-in day; over an
    hour for every policy on 31 days), the results lost (issue 27, hostile pass 7). Each
    of ``outputs`` (the names the run writes in it) must be a regular file or nothing,
    and none of ``inputs`` (``given_inputs``) may be one of them, or, where the run
    writes a CSV, ``path`` itself (a recording reads every CSV in its directory): a
    directory named ``report.md`` failed after the run; ``tune --scaler-config
    OUT/scaler-config.yaml --out OUT`` removed the config it was given when no trial
    met the target; ``tune --trace REC --out REC`` left its CSVs among a recording's
    (hostile pass 48).

    Raises:
        ConfigError: it cannot be made, no file can be made in it, or an output stands
            where it cannot be replaced or is an input; named.
    """
    shown = quote(str(path), 300)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{flag} {shown}: {err.strerror or type(err).__name__}") from err
    try:  # a file made and gone: the permission bits say nothing of root, nor of /proc
        with tempfile.NamedTemporaryFile(dir=path, prefix=".unitscale-"):
            pass
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise ConfigError(f"{flag} {shown}: no file can be made in it ({why})") from err
    for given_flag, given in inputs or []:
        # A recording reads every CSV in its directory; reports and plots it leaves alone.
        if any(name.endswith(".csv") for name in outputs) and _same(given, path):
            raise ConfigError(
                f"{flag} {shown} is the {given_flag} directory: the files written would be"
                " read with it next time"
            )
    for name in outputs:
        target = path / name
        try:
            kind = kind_of(target)
        except OSError as err:
            raise ConfigError(f"{flag} {shown}: {name}: {err.strerror}") from err
        if kind is not None:
            raise ConfigError(f"{flag} {shown}: {name} is {kind}; the run writes a file there")
        for given_flag, given in inputs or []:
            if _same(given, target):
                raise ConfigError(
                    f"{flag} {shown}: {name} is the {given_flag} given, which the run"
                    " replaces: copy it elsewhere first"
                )
    return path


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are the same file or directory (both there)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False
