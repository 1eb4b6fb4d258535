"""``foundation.files``: a file a user named is a regular file read to a stated size.

Issue 27, class 5 (H4 of the admission/CLI hostile pass): ``/dev/zero`` or
``/dev/urandom`` as a config, a ScaledObject, a TLS file, a kubeconfig or a ServeGen
dataset was read until memory ran out (``stat`` says 0 bytes for a device, so a size
check before reading passed), and a FIFO blocked in ``open`` forever.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import ConfigError
from foundation.files import open_regular, read_bytes, read_text
from replay.trace import TraceError


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)  # nobody writes: a blocking open would wait forever
    return path


def _link(tmp_path: Path, target: str) -> Path:
    path = tmp_path / "link.yaml"
    path.symlink_to(target)
    return path


def _directory(tmp_path: Path) -> Path:
    return tmp_path


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "missing.yaml"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda t: Path("/dev/zero"), "not a regular file (a character device)",
                     id="/dev/zero is refused before a byte is read"),
        pytest.param(lambda t: Path("/dev/urandom"), "not a regular file (a character device)",
                     id="/dev/urandom is refused"),
        pytest.param(lambda t: _link(t, "/dev/zero"), "not a regular file (a character device)",
                     id="a symlink to /dev/zero is refused by what it points to"),
        pytest.param(_fifo, "not a regular file (a FIFO)",
                     id="a FIFO without a writer is refused without blocking"),
        pytest.param(_directory, "not a regular file (a directory)", id="a directory is refused"),
        pytest.param(_missing, "No such file or directory", id="a missing file names its path"),
    ],
)  # fmt: skip
def test_anything_but_a_regular_file_is_refused_naming_it(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ConfigError, match="cannot read config file") as error:
        read_text(path, 1024, "config file")
    assert message in str(error.value) and str(path) in str(error.value)


def test_the_caller_chooses_the_error_class(tmp_path):
    with pytest.raises(TraceError, match=r"cannot read trace .*: not a regular file"):
        open_regular(_fifo(tmp_path), "trace", TraceError)


@pytest.mark.parametrize(
    ("size", "limit", "fits"),
    [
        pytest.param(1024, 1024, True, id="a file of exactly the limit is read"),
        pytest.param(1025, 1024, False, id="one byte over the limit is refused"),
        pytest.param(0, 1024, True, id="an empty file is empty text"),
    ],
)
def test_a_file_over_its_limit_is_refused_naming_the_limit(tmp_path, size, limit, fits):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"a" * size)
    if fits:
        assert read_text(path, limit, "config file") == "a" * size
        return
    with pytest.raises(ConfigError, match=r"config file .*c\.yaml is over 1,024 bytes \(1 KiB\)"):
        read_text(path, limit, "config file")


def test_bytes_that_are_not_utf8_name_their_offset(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"key: 3\xff0s\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 \(byte 7\)"):
        read_text(path, 1024, "config file")


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300), limit=st.integers(min_value=0, max_value=300))
def test_any_bytes_are_read_whole_within_the_limit_or_refused(tmp_path_factory, data, limit):
    path = tmp_path_factory.mktemp("f") / "data"
    path.write_bytes(data)
    if len(data) <= limit:
        assert read_bytes(path, limit) == data
    else:
        with pytest.raises(ConfigError, match=f"is over {limit:,} bytes"):
            read_bytes(path, limit)
