"""Reading a file a user named: a regular file only, and never more than a stated size.

A path from a flag or a config key can name anything: ``/dev/zero`` or ``/dev/urandom``
(endless bytes; ``stat`` says 0, so a size check before reading passes), a FIFO (an
``open`` that waits for a writer forever), a directory, a gigabyte. Every reader of a
whole file goes through ``read_text`` or ``read_bytes`` here, and a reader of lines
through ``open_regular``: the file is opened without blocking, refused unless ``fstat``
calls it a regular file, and read to at most ``limit`` bytes (one more is read to tell
"exactly the limit" from "more"). Anything else is the caller's error class (a
``ConfigError`` by default, a ``TraceError`` for traces) naming the file and the limit::

    cannot read config file /dev/zero: not a regular file (a character device)
    config file big.yaml is over 1,048,576 bytes (1 MiB), the most read

Files a command writes go through ``write_file``: written beside the path, then renamed
over it. What stood there is never opened (a FIFO held a finished run forever, waiting
for a reader) and a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO

from foundation.errors import ConfigError, UnitscaleError, quote

KiB = 1 << 10
MiB = 1 << 20

MAX_CONFIG_BYTES = MiB
"""A config, a profiles-file, a ScaledObject or a kubeconfig: the largest real ones are
a few KiB, and a ConfigMap holds at most 1 MiB in all."""
MAX_PEM_BYTES = 256 * KiB
"""A PEM certificate, key or CA bundle: a chain is a few KiB, a system CA bundle ~220 KiB."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(
    path: Path, what: str = "file", error: type[UnitscaleError] = ConfigError
) -> BinaryIO:
    """``path`` open for binary reading, when it is a regular file (symlinks followed).

    The open never blocks: a FIFO is opened non-blocking, seen by ``fstat`` and refused.

    Raises:
        UnitscaleError: ``error``, naming ``what`` and the path: missing, unreadable, or
            not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror}") from err
    except ValueError as err:  # a NUL in the path
        raise error(f"cannot read {what} {quote(str(path))}: {err}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise error(f"cannot read {what} {path}: not a regular file ({kind})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(
    path: Path, limit: int, what: str = "file", error: type[UnitscaleError] = ConfigError
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises:
        UnitscaleError: ``error``, as ``open_regular``, or the file holds more than
            ``limit`` bytes (naming the limit; nothing past ``limit + 1`` is read).
    """
    with open_regular(path, what, error) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as err:
            raise error(f"cannot read {what} {path}: {err.strerror}") from err
    if len(data) > limit:
        raise error(f"{what} {path} is over {_size(limit)}, the most read")
    return data


def read_text(
    path: Path,
    limit: int = MAX_CONFIG_BYTES,
    what: str = "file",
    error: type[UnitscaleError] = ConfigError,
) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes of it.

    Raises:
        UnitscaleError: ``error``, as ``read_bytes``, or bytes that are not UTF-8
            (naming the first bad byte's offset).
    """
    data = read_bytes(path, limit, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"cannot read {what} {path}: not UTF-8 (byte {err.start + 1:,})") from err


def kind_of(path: Path) -> str | None:
    """What stands at ``path`` when it is no regular file: "a directory", "a FIFO", ...

    None when it is one (symlinks followed) or nothing is there.

    Raises:
        OSError: it cannot be looked at (a permission, a symlink loop).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def write_file(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8): written beside it, then renamed.

    A symlink's target is what is replaced, as writing through it would; a regular file
    there keeps its permissions; a new one is made with the process's umask. A hard
    link to the file before keeps the old contents.

    Raises:
        OSError: the directory takes no file, or ``path`` is a directory.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        before = os.stat(path)
        mode = stat.S_IMODE(before.st_mode) if stat.S_ISREG(before.st_mode) else None
    except OSError:
        mode = None
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(payload)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def write_png(path: Path, figure: Any, dpi: int) -> None:
    """A matplotlib figure as a PNG at ``path``, through ``write_file``."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    write_file(path, buffer.getvalue())


def _size(limit: int) -> str:
    """``1048576`` as ``1,048,576 bytes (1 MiB)``."""
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if limit >= unit and limit % unit == 0:
            return f"{limit:,} bytes ({limit // unit:,} {name})"
    return f"{limit:,} bytes"
