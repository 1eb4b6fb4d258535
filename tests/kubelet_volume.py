"""A ConfigMap volume laid out the way the kubelet writes it, with atomic updates.

    config.yaml -> ..data/config.yaml
    ..data -> ..2026_01_02_03_04_05.000000001
    ..2026_01_02_03_04_05.000000001/config.yaml

An update writes a new timestamped directory, points a temporary symlink at it and
renames that over ``..data`` (rename(2) is atomic), then removes the old directory:
a reader sees the old files or the new ones, never a mix.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path


class KubeletVolume:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._serial = itertools.count(1)

    def path(self, key: str) -> Path:
        return self.root / key

    def write(self, files: dict[str, str]) -> None:
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        stamp = f"..2026_01_02_03_04_05.{next(self._serial):09d}"
        (self.root / stamp).mkdir()
        for key, text in files.items():
            (self.root / stamp / key).write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(stamp)
        tmp.rename(data)
        for key in files:
            link = self.root / key
            if not link.is_symlink():
                link.symlink_to(Path("..data") / key)
        if old is not None:
            shutil.rmtree(self.root / old)
