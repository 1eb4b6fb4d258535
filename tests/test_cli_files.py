"""Every file a ``unitscale`` command reads, and its listen and path flags, as a boundary.

Issue 27, classes 5 and 7, from the admission/CLI hostile pass (``H4``, ``M9``-``M14``,
``M16``, ``L10``): a file the user names is a regular file read to a stated size
(``foundation.files``); what it holds is checked level by level; a listen address is
``HOST:PORT`` with a port 0-65535 (``unitscale.flags.host_port``); an empty path is
refused (``unitscale.flags.path``). Each ends in one line and status 2, never a
traceback, an exhausted memory, a blocked ``open`` or a silently different port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import ConfigError
from foundation.grpc_server import GrpcServer
from foundation.kube import KubeAccess
from foundation.net import check_bindable
from foundation.reload import ConfigSource, ConfigStore
from replay.keda import read_scaled_object
from replay.pool.cluster import NODE_COLUMNS, TASK_COLUMNS, read_nodes, read_tasks
from replay.servegen import ServeGenOptions, read_servegen
from replay.trace import TraceError
from scaler.config import ScalerConfig, parse_config
from scaler.server import ScalerServer
from tests.test_cli_flags import TWO_ROWS, unitscale, write
from tests.test_pool_cluster import GOOD_NODE, GOOD_TASK, write_csv
from unitscale import flags

DEEP = "kind: ScaledObject\nspec: " + "[" * 100_000 + "]" * 100_000 + "\n"
"""YAML nested past the parser (a RecursionError of 2,997 traceback lines)."""
SUPERSCRIPT_KEY = '{"\u00b2": {"input_tokens": "{1: 1}", "output_tokens": "{1: 1}"}}'
SERVEGEN_WINDOWS = "0,1.0,1.0,Gamma,1.0,0.5\n600,1.0,1.0,Gamma,1.0,0.5\n"


def _servegen(tmp: Path, dataset: str | None = None, link: str | None = None) -> str:
    directory = tmp / "sg"
    directory.mkdir()
    (directory / "chunk-0-trace.csv").write_text(SERVEGEN_WINDOWS)
    target = directory / "chunk-0-dataset.json"
    if link == "fifo":
        os.mkfifo(target)
    elif link is not None:
        target.symlink_to(link)
    elif dataset is not None:
        target.write_text(dataset)
    return f"servegen:{directory}"


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def _prometheus_ca(path: str) -> str:
    return f"prometheus-source:\n  url: https://127.0.0.1:1\n  ca-file: {path}\n"


def _file(tmp: Path, name: str, content: str | bytes) -> str:
    return write(tmp / name, content.encode() if isinstance(content, str) else content)


SERVER = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
REPLAY = ["replay", "--policy", "static-peak"]
JOINT = ["replay", "--pool-fraction", "1", "--placement", "binpack"]
DEMO = ["demo", "--duration", "1", "--plain"]


def _nodes(tmp: Path, **row: str) -> str:
    return str(write_csv(tmp / "nodes.csv", NODE_COLUMNS, [GOOD_NODE | row]))


def _tasks(tmp: Path, **row: str) -> str:
    return str(write_csv(tmp / "tasks.csv", TASK_COLUMNS, [GOOD_TASK | row]))


# (command line from a tmp directory, a fragment of the one line)
CASES = [
    pytest.param(
        lambda t: [*REPLAY, "--trace", _servegen(t, link="/dev/zero")],
        "cannot read ServeGen dataset",
        id="H4: a ServeGen dataset linked to /dev/zero is refused, not read to exhaustion"),
    pytest.param(
        lambda t: [*REPLAY, "--trace", _servegen(t, link="fifo")],
        "not a regular file (a FIFO)",
        id="H4: a ServeGen dataset that is a FIFO is refused, not waited on"),
    pytest.param(
        lambda t: [*JOINT, "--trace", _file(t, "t.csv", TWO_ROWS), "--pool", "/dev/zero",
                   "--tasks", _tasks(t)],
        "cannot read CSV /dev/zero", id="H4: --pool /dev/zero is refused"),
    pytest.param(
        lambda t: [*JOINT, "--trace", _file(t, "t.csv", TWO_ROWS), "--pool", _nodes(t),
                   "--tasks", "/dev/zero"],
        "cannot read CSV /dev/zero", id="H4: --tasks /dev/zero is refused"),
    pytest.param(
        lambda t: [*REPLAY, "--trace", _file(t, "t.csv", TWO_ROWS), "--scaler-config",
                   "/dev/zero", "--policy", "unitscale"],
        "cannot read config file /dev/zero", id="H4: replay --scaler-config /dev/zero is refused"),
    pytest.param(
        lambda t: ["replay", "--trace", _file(t, "t.csv", TWO_ROWS), "--scaler-config",
                   _file(t, "pf.yaml", "profiles-file: /dev/zero\n")],
        "cannot read profiles-file /dev/zero", id="H4: a profiles-file of /dev/zero is refused"),
    pytest.param(
        lambda t: ["tune", "--trace", _file(t, "t.csv", TWO_ROWS), "--budget", "1", "--batch",
                   "1", "--workers", "1", "--scaler-config", "/dev/urandom"],
        "cannot read config file /dev/urandom",
        id="H4: tune --scaler-config /dev/urandom is refused"),
    pytest.param(
        lambda t: [*DEMO, "--scaled-object", "/dev/zero"],
        "cannot read ScaledObject /dev/zero", id="H4: demo --scaled-object /dev/zero is refused"),
    pytest.param(
        lambda t: ["admission", "--config", "/dev/zero"],
        "cannot read config file /dev/zero", id="H4: admission --config /dev/zero is refused"),
    pytest.param(
        lambda t: ["gateway", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
                   "--config", "/dev/zero"],
        "cannot read config file /dev/zero", id="H4: gateway --config /dev/zero is refused"),
    pytest.param(
        lambda t: ["scaler", *SERVER, "--config", _fifo(t)],
        "not a regular file (a FIFO)",
        id="H4: scaler --config of a FIFO is refused, not waited on"),
    pytest.param(
        lambda t: ["scaler", *SERVER, "--config", _file(t, "ca.yaml", _prometheus_ca(_fifo(t)))],
        "cannot read ca-file",
        id="S4-H2: a prometheus-source ca-file that is a FIFO is refused, not waited on"),
    pytest.param(
        lambda t: ["scaler", *SERVER, "--config", _file(t, "ca.yaml", _prometheus_ca("/dev/zero"))],
        "not a regular file (a character device)",
        id="S4-H2: a prometheus-source ca-file of /dev/zero is refused in one line"),
    pytest.param(
        lambda t: ["scaler", *SERVER, "--tls-cert", "/dev/zero", "--tls-key", "/dev/zero"],
        "cannot read TLS file /dev/zero",
        id="H4: scaler --tls-cert /dev/zero is refused in one line"),
    pytest.param(
        lambda t: [*REPLAY, "--trace", _fifo(t)],
        "cannot read trace", id="L10: a FIFO as --trace is refused, not waited on"),
    pytest.param(
        lambda t: [*REPLAY, "--trace", _servegen(t, SUPERSCRIPT_KEY)],
        "not a start second", id="M9: a ServeGen block key of a superscript digit is refused"),
    pytest.param(
        lambda t: [*REPLAY, "--trace", _servegen(t, json.dumps(
            {"9" * 5000: {"input_tokens": "{1: 1}", "output_tokens": "{1: 1}"}}))],
        "not a start second", id="M9: a ServeGen block key of 5,000 digits is refused"),
    pytest.param(
        lambda t: [*JOINT, "--trace", _file(t, "t.csv", TWO_ROWS),
                   "--pool", _nodes(t, cpu_milli="9" * 4000), "--tasks", _tasks(t)],
        "column cpu_milli", id="M10: a 4,000-digit cpu_milli names its column"),
    pytest.param(
        lambda t: [*JOINT, "--trace", _file(t, "t.csv", TWO_ROWS),
                   "--pool", _nodes(t, model='"' + "a" * 200_000 + '"'), "--tasks", _tasks(t)],
        "field larger than field limit", id="M10: a node field over 128 KiB names its line"),
    pytest.param(
        lambda t: [*JOINT, "--trace", _file(t, "t.csv", TWO_ROWS),
                   "--pool", _nodes(t, gpu="0"), "--tasks", _tasks(t)],
        "the static partition needs", id="M10: a pool without room for inference is one line"),
    pytest.param(
        lambda t: [*DEMO, "--scaled-object",
                   _file(t, "so.yaml", "kind: ScaledObject\nmetadata: []\n")],
        "metadata: expected a mapping, got a list",
        id="M11: a ScaledObject's metadata list is named"),
    pytest.param(
        lambda t: [*DEMO, "--scaled-object",
                   _file(t, "so.yaml", b"kind: ScaledObject\nmetadata: {name: x\xff}\n")],
        "not UTF-8", id="M11: a ScaledObject that is not UTF-8 is refused"),
    pytest.param(
        lambda t: [*DEMO, "--scaled-object", _file(t, "so.yaml", DEEP)],
        "nested too deeply", id="M11: a ScaledObject nested 100,000 deep is refused"),
    pytest.param(
        lambda t: ["admission", "--kubeconfig", _file(t, "kc.yaml", b"clusters: [a\xff]\n")],
        "--kubeconfig", id="M12: a kubeconfig that is not UTF-8 is one line"),
    pytest.param(
        lambda t: ["admission", "--kubeconfig", _file(t, "kc.yaml", DEEP)],
        "nested too deeply", id="M12: a kubeconfig nested 100,000 deep is one line"),
    pytest.param(
        lambda t: ["admission", "--kubeconfig", "/dev/zero"],
        "cannot read kubeconfig /dev/zero", id="M12: a kubeconfig of /dev/zero is refused"),
    pytest.param(
        lambda t: ["admission", "--kubeconfig", str(t / "missing.yaml")],
        "missing.yaml: no such file",
        id="a kubeconfig not there is one line, not the client's warning and its own"),
    pytest.param(
        lambda t: ["admission", "--kubeconfig", _file(t, "kc.yaml", b"\n")],
        "kc.yaml: empty", id="an empty kubeconfig says so, not NoneType"),
    pytest.param(
        lambda t: ["scaler", "--listen", "[::1:0", "--metrics-listen", "127.0.0.1:0"],
        "argument --listen", id="M13: a listen address gRPC cannot parse is refused as a flag"),
    pytest.param(
        lambda t: ["scaler", "--listen", "127.0.0.1:99999", "--metrics-listen", "127.0.0.1:0"],
        "argument --listen", id="M13: port 99999 is refused, not bound as 34463"),
    pytest.param(
        lambda t: ["gateway", "--listen", "127.0.0.1:\u0660", "--grpc-listen", "127.0.0.1:0"],
        "argument --listen", id="M13: a port of Arabic-Indic digits is refused"),
    pytest.param(
        lambda t: ["gateway", "--listen", "256.1.1.1:8080", "--replica", "http://127.0.0.1:1"],
        "--listen '256.1.1.1:8080': ", id="a listen host that does not resolve names the flag"),
    pytest.param(
        lambda t: ["gateway", "--listen", "[fe80::1]:0", "--replica", "http://127.0.0.1:1"],
        "--listen '[fe80::1]:0': ", id="a listen address that does not bind names the flag"),
    pytest.param(
        lambda t: ["exporter", "--listen", "256.1.1.1:8080", "--target", "http://127.0.0.1:1"],
        "--listen '256.1.1.1:8080': ", id="an exporter host that does not resolve names --listen"),
    pytest.param(
        lambda t: ["exporter", "--listen", "[fe80::1]:0", "--target", "http://127.0.0.1:1"],
        "--listen '[fe80::1]:0': ", id="an exporter address that does not bind names --listen"),
    pytest.param(
        lambda t: ["admission", "--metrics-listen", "127.0.0.1:65536"],
        "argument --metrics-listen", id="M13: the admission metrics port above 65535 is refused"),
    pytest.param(
        lambda t: [*REPLAY, "--trace", ""],
        "argument --trace: an empty path",
        id="M16: --trace '' is refused, not the current directory"),
    pytest.param(
        lambda t: [*REPLAY, "--trace", _file(t, "t.csv", TWO_ROWS), "--report", ""],
        "argument --report: an empty path",
        id="M16: --report '' is refused, not written to the cwd"),
    pytest.param(
        lambda t: ["tune", "--trace", _file(t, "t.csv", TWO_ROWS), "--out", ""],
        "argument --out: an empty path", id="M16: tune --out '' is refused"),
    pytest.param(
        lambda t: ["scaler", "--listen", "256.1.1.1:9090", "--metrics-listen", "127.0.0.1:0"],
        "--listen '256.1.1.1:9090': ",
        id="a gRPC listen host that does not resolve is our one line, not gRPC's log first"),
    pytest.param(
        lambda t: ["gateway", "--listen", "127.0.0.1:0", "--grpc-listen", "[fe80::1]:0",
                   "--replica", "http://127.0.0.1:1"],
        "--grpc-listen '[fe80::1]:0': ",
        id="a gRPC listen address that does not bind is our one line, not gRPC's log first"),
    pytest.param(
        lambda t: ["scaler", "--listen", "127.1:0", "--metrics-listen", "127.0.0.1:0"],
        "--listen '127.1:0': write the address in full",
        id="a short numeric host the C library reads and gRPC does not is our one line"),
    pytest.param(
        lambda t: ["scaler", "--config-configmap", "", "--listen", "127.0.0.1:0",
                   "--metrics-listen", "127.0.0.1:0"],
        "--config-configmap '': expected NAMESPACE/NAME",
        id="an empty --config-configmap is refused, not a server on its defaults"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "fragment"), CASES)
def test_a_hostile_file_or_flag_is_one_line_and_status_2(tmp_path, command, fragment):
    args = command(tmp_path)
    if args[0] in ("replay", "demo") and "--report" not in args:
        args = [*args, "--report", str(tmp_path / "out")]
    if args[0] == "tune" and "--out" not in args:
        args = [*args, "--out", str(tmp_path / "out")]
    done = unitscale(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"unitscale {args[0]}: ") and fragment in done.stderr


# --- M9 and M10: the readers themselves ---------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("\u00b2", id="a superscript two is not a start second"),
        pytest.param("\u0661\u0662", id="Arabic-Indic digits are not a start second"),
        pytest.param("9" * 5000, id="5,000 digits are not a start second"),
        pytest.param("1234567890", id="ten digits are past any 31 days"),
    ],
)
def test_a_servegen_block_key_is_ascii_digits_within_bounds(tmp_path, key):
    source = _servegen(
        tmp_path, json.dumps({key: {"input_tokens": "{1: 1}", "output_tokens": "{1: 1}"}})
    )
    with pytest.raises(TraceError, match="not a start second"):
        read_servegen(Path(source.removeprefix("servegen:")), ServeGenOptions())


@pytest.mark.parametrize(
    ("nodes", "tasks", "message"),
    [
        pytest.param({"cpu_milli": "9" * 4000}, {}, "column cpu_milli: '99",
                     id="a node's 4000-digit cpu_milli names the column, not an OverflowError"),
        pytest.param({"memory_mib": "\u0662"}, {}, "column memory_mib: '\u0662' is not an integer",
                     id="an Arabic-Indic digit is not an integer"),
        pytest.param({"cpu_milli": "10000001"}, {}, "is above 10,000,000",
                     id="a CPU past ten thousand cores names the limit"),
        pytest.param({}, {"num_gpu": "9" * 4000}, "column num_gpu: '99",
                     id="a task's 4000-digit num_gpu names the column"),
        pytest.param({}, {"num_gpu": "65", "gpu_milli": "1000"}, "is above 64",
                     id="a task asking more GPUs than a node holds is refused"),
        pytest.param({"model": '"' + "a" * 200_000 + '"'}, {},
                     "nodes.csv:2: field larger than field limit",
                     id="a field over the csv module's limit names its line"),
    ],
)  # fmt: skip
def test_pool_csv_columns_are_bounded_ascii_integers(tmp_path, nodes, tasks, message):
    node_path, task_path = Path(_nodes(tmp_path, **nodes)), Path(_tasks(tmp_path, **tasks))
    with pytest.raises(ValueError) as error:
        read_nodes(node_path)
        read_tasks(task_path)
    assert message in str(error.value)


def test_a_byte_order_mark_before_the_node_list_header_is_not_part_of_it(tmp_path):
    path = Path(_nodes(tmp_path))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert [node.name for node in read_nodes(path)] == ["node-a"]


# --- M11: a ScaledObject read level by level -----------------------------------------------


def _so(**spec: object) -> dict[str, object]:
    trigger = {"type": "external", "metadata": {"scalerAddress": "x:9090"}}
    return {"kind": "ScaledObject", "metadata": {"name": "a"},
            "spec": {"triggers": [trigger], **spec}}  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param({"kind": "ScaledObject", "metadata": []},
                     "metadata: expected a mapping, got a list", id="metadata a list is named"),
        pytest.param({"kind": "ScaledObject", "spec": [1, 2]},
                     "spec: expected a mapping, got a list", id="spec a list is named"),
        pytest.param(_so(triggers={"a": 1}), "spec.triggers: expected a list, got a mapping",
                     id="triggers a mapping is named"),
        pytest.param(_so(triggers=["external"]), "spec.triggers.0: expected a mapping",
                     id="a trigger that is a string is named"),
        pytest.param(_so(advanced=[]), "spec.advanced: expected a mapping",
                     id="advanced a list is named"),
        pytest.param(_so(advanced={"horizontalPodAutoscalerConfig": {"behavior": {
                         "scaleDown": {"policies": {"type": "Percent"}}}}}),
                     "policies: expected a list", id="policies a mapping is named"),
        pytest.param(_so(advanced={"horizontalPodAutoscalerConfig": {"behavior": {
                         "scaleUp": {"policies": [{"type": "Pods", "value": float("inf"),
                                                   "periodSeconds": 15}]}}}}),
                     "value inf is not a number from 0", id="an infinite policy value is refused"),
        pytest.param(_so(fallback=[1]), "fallback: expected a mapping",
                     id="fallback a list is named"),
        pytest.param(_so(minReplicaCount=float("inf")), "minReplicaCount inf",
                     id="an infinite count is refused, not an OverflowError"),
        pytest.param(_so(maxReplicaCount=10**5000), "maxReplicaCount an integer of",
                     id="a 5000-digit count is refused"),
        pytest.param(_so(pollingInterval=True), "pollingInterval True",
                     id="a boolean interval is refused"),
        pytest.param(_so(cooldownPeriod=-1), "cooldownPeriod -1", id="a negative cooldown"),
        pytest.param({"kind": "ScaledObject", "metadata": {"name": ["a"]}, **_so()},
                     "", id="a well-formed document still reads"),
    ],
)  # fmt: skip
def test_a_scaled_object_of_the_wrong_shape_is_a_config_error_naming_the_key(doc, message):
    if not message:
        assert read_scaled_object(doc).name == "a"
        return
    with pytest.raises(ConfigError) as error:
        read_scaled_object(doc)
    assert message in str(error.value)


@settings(max_examples=200, deadline=None)
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                     max_size=3),
        max_leaves=8,
    ),
    where=st.sampled_from(["metadata", "spec", "triggers", "trigger", "advanced", "fallback",
                           "minReplicaCount", "pollingInterval", "trigger-metadata"]),
)  # fmt: skip
def test_any_value_anywhere_in_a_scaled_object_reads_or_is_a_config_error(value, where):
    doc = _so()
    spec = doc["spec"]
    assert isinstance(spec, dict)
    if where in ("metadata", "spec"):
        doc[where] = value
    elif where == "triggers":
        spec["triggers"] = value
    elif where == "trigger":
        spec["triggers"] = [value]
    elif where == "trigger-metadata":
        spec["triggers"][0]["metadata"] = value
    else:
        spec[where] = value
    try:
        read_scaled_object(doc)
    except ConfigError:
        pass


# --- M12: a kubeconfig the client cannot read ---------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"clusters: [a\xff]\n", "--kubeconfig", id="not UTF-8 is a config error"),
        pytest.param(b"clusters: [a\x00]\n", "--kubeconfig", id="a NUL byte is a config error"),
        pytest.param(DEEP.encode(), "nested too deeply", id="deep YAML is a config error"),
        pytest.param(b"a" * (2 << 20), "over 1,048,576 bytes", id="two MiB are refused unread"),
        pytest.param(b"- 1\n- 2\n", "--kubeconfig", id="a list is a config error"),
    ],
)
async def test_a_kubeconfig_that_cannot_be_read_is_a_config_error(tmp_path, content, message):
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as error:
        await KubeAccess(path).client()
    assert message in str(error.value)


def _kubeconfig_with_token(token_file: str) -> bytes:
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        f"users: [{{name: u, user: {{tokenFile: '{token_file}'}}}}]\n"
    ).encode()


@pytest.mark.parametrize(
    ("token", "message"),
    [
        pytest.param("/dev/zero", "cannot read kubeconfig tokenFile /dev/zero",
                     id="a token file of /dev/zero is refused, not read until memory runs out"),
        pytest.param("big-token", "over 65,536 bytes",
                     id="a token file over 64 KiB is refused, relative to the kubeconfig"),
    ],
)  # fmt: skip
async def test_a_token_file_is_read_within_its_bound(tmp_path, token, message):
    (tmp_path / "big-token").write_bytes(b"t" * (100 << 10))
    path = tmp_path / "kubeconfig"
    path.write_bytes(_kubeconfig_with_token(token))
    with pytest.raises(ConfigError) as error:
        await KubeAccess(path).client()
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            b"a: &x [1, 1]\nb: [*x, *x]\n", "YAML aliases",
            id="aliases are refused before they expand (709 bytes reached 10^8 entries)"),
        pytest.param(
            ("users:\n" + "".join(f"- {{name: u{i}, user: {{}}}}\n" for i in range(300))).encode(),
            "300 users, more than the 256 read",
            id="300 users are refused, not merged pairwise for minutes"),
    ],
)  # fmt: skip
async def test_a_kubeconfig_the_client_would_blow_up_on_is_refused(tmp_path, content, message):
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as error:
        await KubeAccess(path).client()
    assert message in str(error.value)


async def test_a_token_file_is_found_where_the_client_opens_it_a_tilde_not_expanded(tmp_path):
    (tmp_path / "~").mkdir()
    (tmp_path / "~" / "token").write_bytes(b"t" * (100 << 10))
    path = tmp_path / "kubeconfig"
    path.write_bytes(_kubeconfig_with_token("~/token"))
    with pytest.raises(ConfigError, match="over 65,536 bytes"):
        await KubeAccess(path).client()


async def test_a_token_file_within_its_bound_is_taken(tmp_path):
    (tmp_path / "token").write_text("abc")
    path = tmp_path / "kubeconfig"
    path.write_bytes(_kubeconfig_with_token("token"))
    api = await KubeAccess(path).client()
    await api.close()


def _kubeconfig_naming(where: str, key: str, path: str) -> bytes:
    cluster = "server: 'https://127.0.0.1:1'"
    user = "token: t"
    if where == "cluster":
        cluster += f", {key}: '{path}'"
    else:
        user = f"{key}: '{path}'"
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{{cluster}}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        f"users: [{{name: u, user: {{{user}}}}}]\n"
    ).encode()


@pytest.mark.parametrize(
    ("where", "key"),
    [
        pytest.param("cluster", "certificate-authority", id="a cluster's certificate-authority"),
        pytest.param("user", "client-certificate", id="a user's client-certificate"),
        pytest.param("user", "client-key", id="a user's client-key"),
    ],
)  # fmt: skip
@pytest.mark.parametrize(
    "special",
    [
        pytest.param("fifo", id="that is a FIFO is refused, not waited on"),
        pytest.param("/dev/zero", id="of /dev/zero is refused, not read until memory runs out"),
        pytest.param("big.pem", id="over 256 KiB is refused"),
    ],
)
async def test_every_file_a_kubeconfig_names_is_read_within_its_bound(
    tmp_path, where, key, special
):
    (tmp_path / "big.pem").write_bytes(b"-" * (300 << 10))
    named = _fifo(tmp_path) if special == "fifo" else special
    path = tmp_path / "kubeconfig"
    path.write_bytes(_kubeconfig_naming(where, key, named))
    with pytest.raises(ConfigError) as error:
        async with asyncio.timeout(10):  # a cap against the hang this refuses
            await KubeAccess(path).client()
    expected = "over 262,144 bytes" if special == "big.pem" else "not a regular file"
    assert f"kubeconfig {key}" in str(error.value) and expected in str(error.value)


# --- M13: listen addresses ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        pytest.param("0.0.0.0:9090", True, id="every IPv4 interface"),
        pytest.param("127.0.0.1:0", True, id="port 0 lets the kernel pick"),
        pytest.param("[::1]:65535", True, id="an IPv6 address in brackets, the top port"),
        pytest.param("localhost:8080", True, id="a host name"),
        pytest.param("127.0.0.1:65536", False, id="one past the top port"),
        pytest.param("127.0.0.1:99999", False, id="99999 is not taken modulo 65536"),
        pytest.param("[::1:0", False, id="an unclosed bracket"),
        pytest.param("[zz::1]:80", False, id="brackets around something not IPv6"),
        pytest.param("127.0.0.1:\u0660", False, id="Arabic-Indic digits"),
        pytest.param(":9090", False, id="no host"),
        pytest.param("127.0.0.1", False, id="no port"),
        pytest.param("a b:80", False, id="a space in the host"),
        pytest.param("a" * 63 + ".example:0", True, id="a label of 63 characters"),
        pytest.param("localhost.:0", True, id="a trailing dot, the root"),
        pytest.param("a" * 64 + ":0", False, id="a label of 64 characters the bind cannot encode"),
        pytest.param("..:0", False, id="empty labels the bind cannot encode"),
        pytest.param("a..b:0", False, id="an empty label between two"),
        pytest.param(".:0", False, id="the root alone"),
        pytest.param("[fe80::1%lo]:0", "zone id", id="a zone id is refused saying so"),
    ],
)
def test_a_listen_address_is_host_and_a_port_from_0_to_65535(text, valid):
    if valid is True:
        assert flags.host_port(text) == text
    else:
        why = "is not HOST:PORT" if valid is False else valid
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            flags.host_port(text)


@settings(max_examples=300, deadline=None)
@given(
    host=st.sampled_from(["127.0.0.1", "[::1]", "localhost", "", "[::1", "a b"]) | st.text(),
    port=st.integers(-10, 10**6).map(str) | st.text(max_size=7),
)
def test_any_listen_text_is_a_bindable_form_or_refused(host, port):
    text = f"{host}:{port}"
    try:
        value = flags.host_port(text)
    except argparse.ArgumentTypeError:
        return
    assert port.isascii() and port.isdigit() and 0 <= int(port) <= 65535 and value == text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="a-1", max_size=70), min_size=1, max_size=5).map(".".join))
def test_any_listen_host_taken_is_one_the_bind_can_encode(host):
    """A 100-character label or '..' passed and the aiohttp bind's IDNA codec raised a
    45-line UnicodeError (issue 27, hostile pass 4, M4)."""
    try:
        flags.host_port(f"{host}:0")
    except argparse.ArgumentTypeError:
        return
    host.encode("idna")


@pytest.mark.parametrize(
    "listen",
    [
        pytest.param("127.0.0.1:0", id="a dotted quad"),
        pytest.param("0.0.0.0:0", id="every IPv4 address"),
        pytest.param("localhost:0", id="a name"),
        pytest.param("[::1]:0", id="the IPv6 loopback"),
        pytest.param("[::ffff:127.0.0.1]:0", id="an IPv4-mapped IPv6 address, which gRPC binds"),
    ],
)
def test_an_address_grpc_binds_is_taken_by_the_check_before_it(listen):
    if ":" in listen.rpartition(":")[0] and not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    check_bindable("--listen", listen)


async def test_an_address_gRPC_cannot_bind_is_a_config_error_naming_the_flag():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        taken = f"--listen '127.0.0.1:{port}': Address already in use"
        with pytest.raises(ConfigError, match=taken):
            GrpcServer([], f"127.0.0.1:{port}", flag="--listen")


# --- M14: no config source is not a dead reload loop ---------------------------------------


async def test_following_no_config_source_waits_instead_of_returning():
    store = ConfigStore(ScalerConfig(), parse_config)
    follow = asyncio.create_task(ConfigSource().follow(store))
    for _ in range(20):  # yield to the loop: returning needs one step, waiting never ends
        await asyncio.sleep(0)
    assert not follow.done()
    follow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follow


async def test_a_scaler_without_a_config_file_stays_healthy():
    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", source=ConfigSource())
    await server.start()
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert server.problem() is None
    finally:
        await server.stop(grace=0)


# --- L2, L5, L7: absurd but in-domain values, and a message that contradicted itself ------


@pytest.mark.parametrize(
    ("domain", "text"),
    [
        pytest.param(flags.RATE_MULTIPLIER, "1_0", id="L2: an underscore in a number is refused"),
        pytest.param(flags.PRICE, "\u0661", id="L2: an Arabic-Indic digit is refused"),
        pytest.param(flags.PRICE, "infinity", id="L2: infinity spelled out is refused"),
        pytest.param(flags.SLO_SECONDS, "5e-324", id="L2: an SLO below a millisecond is refused"),
        pytest.param(flags.SPEEDUP, "5e-324", id="L7: a replica speedup of 5e-324 is refused"),
        pytest.param(flags.BUFFER_SIZE, "9" * 23, id="L7: a 23-digit gateway buffer is refused"),
    ],
)
def test_a_flag_outside_its_plain_ascii_domain_is_refused(domain, text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not a"):
        domain(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("1e-3", 0.001, id="an exponent is a number"),
        pytest.param(" +.5 ", 0.5, id="a sign, a bare fraction and spaces are a number"),
        pytest.param("1000", 1000.0, id="an integer is a number"),
    ],
)
def test_a_plain_number_is_still_read(text, value):
    assert flags.RATE_MULTIPLIER(text) == value


def test_servegen_data_longer_than_a_replay_says_so_without_contradicting_itself(tmp_path):
    directory = tmp_path / "sg"
    directory.mkdir()
    # windows from day 0 to the last of day 31: 32 days, one more than a replay spans
    (directory / "chunk-0-trace.csv").write_text(
        "0,1.0,1.0,Gamma,1.0,0.5\n2678400,1.0,1.0,Gamma,1.0,0.5\n"
    )
    with pytest.raises(TraceError) as error:
        read_servegen(directory, ServeGenOptions(scale=0.0001))
    assert str(error.value).endswith(
        "days 0-31 are 32 days; a replay spans at most 31; choose some with ?days=A-B"
    )
