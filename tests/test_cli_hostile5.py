"""The `unitscale` commands under the fifth hostile pass (issue 27): files and flags.

A kubeconfig is read once before the client merges it, and what the merge would blow up
on is one line naming the flag: an alias of any node (a string too), or a list of more
files than anyone merges. A ServeGen directory's distributions are bounded in all and
parsed once, however many days are drawn.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from foundation.errors import ConfigError
from foundation.kube import MAX_KUBECONFIG_FILES, KubeAccess

_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}%s}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(', extra: [&a "xxxx", *a, *a]', id="an alias of a string is refused"),
        pytest.param(", extra: [&a 1, *a]", id="an alias of a number is refused"),
        pytest.param(", extra: &a [1]\n  , more: *a", id="an alias of a list is refused"),
        pytest.param(", extra: {<<: &a {k: v}, o: *a}", id="a merge key's alias is refused"),
    ],
)
async def test_a_kubeconfig_alias_of_any_node_is_one_line(tmp_path, extra):
    """An aliased string passed the check of lists and mappings met twice: 950 KB of
    aliases of one 400 KB string expanded to 55 GB in the client's merge, a MemoryError
    and a 46-line traceback (issue 27, hostile pass 5, H1)."""
    path = tmp_path / "kubeconfig"
    path.write_text(_KUBECONFIG % extra)
    with pytest.raises(ConfigError, match="YAML aliases are not read"):
        await KubeAccess(path).client()


async def test_a_kubeconfig_without_aliases_is_read(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(_KUBECONFIG % ', extra: ["&not an alias", "*nor this"]')
    api = await KubeAccess(path).client()
    await api.close()


@pytest.mark.parametrize(
    ("count", "refused"),
    [
        pytest.param(1, False, id="one kubeconfig is read"),
        pytest.param(MAX_KUBECONFIG_FILES, False, id="sixteen listed files are read"),
        pytest.param(MAX_KUBECONFIG_FILES + 1, True, id="seventeen listed files are one line"),
        pytest.param(5_000, True, id="five thousand listed files are one line before any is read"),
    ],
)
async def test_a_kubeconfig_list_is_bounded_in_files(tmp_path, count, refused):
    """``--kubeconfig a:a:...`` parsed and merged every name, ~1 s each for 1 MiB: a
    128 KiB flag listed thousands (issue 27, hostile pass 5, M1)."""
    (tmp_path / "k").write_text(_KUBECONFIG % "")
    listed = os.pathsep.join([str(tmp_path / "k")] * count)
    if refused:
        with pytest.raises(ConfigError, match=f"lists {count:,} files; at most 16 are read"):
            await KubeAccess(Path(listed)).client()
    else:
        api = await KubeAccess(Path(listed)).client()
        await api.close()
