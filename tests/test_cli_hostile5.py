"""The `unitscale` commands under the fifth hostile pass (issue 27): files and flags.

A kubeconfig is read once before the client merges it, and what the merge would blow up
on is one line naming the flag: an alias of any node (a string too), or a list of more
files than anyone merges. A ServeGen directory's distributions are bounded in all and
parsed once, however many days are drawn. A ScaledObject polls at most once a second.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from foundation.errors import ConfigError
from foundation.kube import MAX_KUBECONFIG_FILES, KubeAccess
from replay import servegen
from replay.keda import read_scaled_object
from replay.servegen import ServeGenOptions, read_servegen
from replay.trace import TraceError

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


def _servegen(directory: Path, clients: int, days: int, pairs: int) -> Path:
    """``clients`` clients with a window a day, each one block of ``pairs`` token counts."""
    directory.mkdir()
    text = "{" + ", ".join(f"{1 + i}: 1" for i in range(pairs)) + "}"
    dataset = json.dumps({"0": {"input_tokens": text, "output_tokens": text}})
    rows = "".join(f"{day * 86_400},0.01,1,Gamma,1,1\n" for day in range(days))
    for client in range(clients):
        (directory / f"chunk-{client}-trace.csv").write_text(rows)
        (directory / f"chunk-{client}-dataset.json").write_text(dataset)
    return directory


def test_a_servegen_block_is_parsed_once_whatever_the_days_drawn(tmp_path, monkeypatch):
    """Each day drawn parsed every block it used again: 8 clients sharing one 8 MB file
    took 19 s a day, 31 days ten minutes (issue 27, hostile pass 5, M4)."""
    parsed: list[str] = []

    def counting(text: str, where: str) -> Any:
        parsed.append(where)
        return pdf(text, where)

    pdf = servegen._pdf
    monkeypatch.setattr(servegen, "_pdf", counting)
    directory = _servegen(tmp_path / "sg", clients=2, days=5, pairs=10)
    trace = read_servegen(directory, ServeGenOptions(scale=1.0, days=(0, 4)))
    assert len(trace) == 2 * (4 * 864 + 6)  # a day of 0.01/s, the last window 600 s
    assert len(parsed) == 2 * 2, "each client's input and output text once"


@pytest.mark.parametrize(
    ("clients", "refused"),
    [
        pytest.param(2, False, id="token counts within the directory's bound are read"),
        pytest.param(3, True, id="token counts past the directory's bound are one line"),
    ],
)
def test_a_servegen_directory_is_bounded_in_token_counts_in_all(
    tmp_path, monkeypatch, clients, refused
):
    """Parsed once and kept, the distributions are bounded in all before any is parsed."""
    monkeypatch.setattr(servegen, "MAX_PAIRS", 2 * 2 * 10)
    monkeypatch.setattr(servegen, "_pdf", _never_parsed)
    directory = _servegen(tmp_path / "sg", clients=clients, days=1, pairs=10)
    if refused:
        with pytest.raises(TraceError, match="more than 40 token counts in all"):
            read_servegen(directory, ServeGenOptions(scale=1.0))
    else:
        with pytest.raises(AssertionError, match="parsed"):
            read_servegen(directory, ServeGenOptions(scale=1.0))


def _never_parsed(text: str, where: str) -> Any:
    raise AssertionError(f"{where} parsed")


@pytest.mark.parametrize(
    ("scale", "taken"),
    [
        pytest.param("0.5", 0.5, id="a decimal scale is read"),
        pytest.param("1e-2", 0.01, id="an exponent is read"),
        pytest.param("١", None, id="an Arabic-Indic digit is no scale"),
        pytest.param("1_0", None, id="an underscore is no scale"),
        pytest.param("inf", None, id="infinity is no scale"),
    ],
)
def test_a_servegen_scale_is_ascii_decimal(scale, taken):
    """``float()`` read ``scale=١`` as 1 (issue 27, hostile pass 5, L1)."""
    if taken is None:
        with pytest.raises(TraceError, match="scale="):
            servegen.parse_source(f"servegen:d?scale={scale}")
    else:
        assert servegen.parse_source(f"servegen:d?scale={scale}")[1].scale == taken


def _scaled_object(polling: object) -> dict[str, Any]:
    text = (Path(__file__).parent.parent / "deploy/scaledobjects/recommended.yaml").read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    doc["spec"]["pollingInterval"] = polling
    return doc


@pytest.mark.parametrize(
    ("polling", "taken"),
    [
        pytest.param(15, 15.0, id="a polling interval of 15 s is read"),
        pytest.param(1, 1.0, id="a polling interval of a second is read"),
        pytest.param(0, None, id="a polling interval of 0 is one line"),
        pytest.param(0.001, None, id="a polling interval under a second is one line"),
    ],
)
def test_a_scaled_objects_polling_interval_is_at_least_a_second(polling, taken):
    """``demo --scaled-object`` with ``pollingInterval: 0`` ran, and its KEDA polled the
    scaler in a loop: 117,149 calls in half a second (issue 27, hostile pass 5, M6)."""
    if taken is None:
        with pytest.raises(ConfigError, match=r"pollingInterval .* is not a number from 1 to"):
            read_scaled_object(_scaled_object(polling), "so.yaml")
    else:
        assert read_scaled_object(_scaled_object(polling)).spec.polling_interval == taken
