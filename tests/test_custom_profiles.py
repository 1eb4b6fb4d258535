"""An SRE's own replica profiles: the scaler config's ``profiles`` and ``profiles-file``.

A profile the config defines plans exactly as a built-in one with the same numbers; a
reload that changes its numbers changes the capacity; a trigger naming one nobody
defined is refused over gRPC, naming every known one; bad numbers are refused, naming
the key.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import yaml

from foundation.errors import ConfigError, MetadataError
from foundation.replica_model import LLAMA3_8B_H200, PROFILES, QWEN25_32B_H200, Profile
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from replay.policies import Unitscale
from replay.run import ReplayOptions, make_policy
from replay.simulate import SimConfig
from scaler.config import MAX_PROFILES, parse_config
from scaler.core.capacity import Mix, profile_for, replica_rates
from scaler.core.model import Policy
from scaler.metadata import TriggerMetadata
from scaler.registry import ScaledObjectRegistry
from scaler.server import ScalerServer
from scaler.signals import SignalStore
from tests.conftest import ref


def profile_yaml(profile: Profile, **changes: object) -> dict[str, object]:
    """``profile``'s numbers as a ``profiles`` entry of the scaler config."""
    entry: dict[str, object] = {
        "model": profile.model,
        "decode-ms": list(profile.decode_ms),
        "prefill-ms": list(profile.prefill_ms),
        "weights-gb": profile.weights_gb,
        "kv-bytes-per-token": profile.kv_bytes_per_token,
        "accelerator-memory-bytes": profile.accelerator_memory_bytes,
        "price-per-hour": profile.price_per_hour,
        "engine-init": profile.engine_init_seconds,
    }
    entry.update(changes)
    return entry


def config_text(profiles: dict[str, object], **top: object) -> str:
    return yaml.safe_dump({"profiles": profiles, **top})


TRIGGER = {"scalerAddress": "unitscale-scaler.keda:9090", "deployment": "chat", "profile": "mine"}
MIXES = [Mix(1155.0, 211.0), Mix(12_000.0, 350.0)]


@pytest.mark.parametrize(
    ("builtin", "mix"),
    [
        pytest.param(LLAMA3_8B_H200, MIXES[0], id="llama3-8b's numbers plan a chat mix alike"),
        pytest.param(LLAMA3_8B_H200, MIXES[1], id="llama3-8b's numbers plan long prompts alike"),
        pytest.param(QWEN25_32B_H200, MIXES[0], id="qwen2.5-32b's numbers plan a chat mix alike"),
        pytest.param(QWEN25_32B_H200, MIXES[1], id="qwen2.5-32b's numbers plan long prompts alike"),
    ],
)
def test_a_custom_profile_with_a_built_in_s_numbers_has_its_capacity(builtin, mix):
    config = parse_config(config_text({"mine": profile_yaml(builtin)}, policy={"profile": "mine"}))
    policy = config.policy_defaults()
    assert profile_for(policy) == replace(builtin, name="mine")
    own = replica_rates(policy, mix)
    theirs = replica_rates(Policy(profile=builtin.name), mix)
    assert (own.prefill_tokens_per_second, own.decode_tokens_per_second) == (
        theirs.prefill_tokens_per_second,
        theirs.decode_tokens_per_second,
    )
    assert own.requests_per_second == theirs.requests_per_second
    assert own.source == "profile mine"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"decode-ms": [11.5, 0.034, 0.000056]}, id="slower decode steps"),
        pytest.param({"prefill-ms": [9.7, 0.0406, 1.46e-06]}, id="slower prefill"),
    ],
)
def test_a_reload_that_changes_a_coefficient_changes_the_capacity(change):
    """The same name, new numbers: the registry's policy and the capacity cache follow."""
    first = parse_config(config_text({"mine": profile_yaml(LLAMA3_8B_H200)}))
    second = parse_config(config_text({"mine": profile_yaml(LLAMA3_8B_H200, **change)}))
    registry = ScaledObjectRegistry(SignalStore(), 30.0, lambda: 0.0, first.policy_defaults())
    scaled = registry.resolve("chat", "team-a", TRIGGER)
    before = replica_rates(scaled.policy, MIXES[0])
    registry.set_policy_defaults(second.policy_defaults())
    after = replica_rates(scaled.policy, MIXES[0])
    assert after.requests_per_second is not None and before.requests_per_second is not None
    assert after.requests_per_second < before.requests_per_second
    assert after.source == before.source == "profile mine"


def test_a_reload_that_drops_a_named_profile_keeps_the_objects_policy():
    first = parse_config(config_text({"mine": profile_yaml(LLAMA3_8B_H200)}))
    registry = ScaledObjectRegistry(SignalStore(), 30.0, lambda: 0.0, first.policy_defaults())
    scaled = registry.resolve("chat", "team-a", TRIGGER)
    registry.set_policy_defaults(parse_config("").policy_defaults())
    assert profile_for(scaled.policy) == replace(LLAMA3_8B_H200, name="mine")
    with pytest.raises(MetadataError, match=r"one of llama3-8b-h200, qwen2\.5-32b-h200, or"):
        scaled.metadata.policy(parse_config("").policy_defaults())


@pytest.fixture
async def custom_scaler(clock):
    config = parse_config(config_text({"mistral-7b-l40s": profile_yaml(LLAMA3_8B_H200)}))
    server = ScalerServer(config, "127.0.0.1:0", clock=clock)
    await server.start()
    yield server
    await server.stop(grace=0)


async def test_a_trigger_naming_an_unknown_profile_is_invalid_argument_naming_all(
    custom_scaler,
):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{custom_scaler.port}") as channel:
        stub = keda_grpc.ExternalScalerStub(channel)
        spec = await stub.GetMetricSpec(ref(profile="mistral-7b-l40s"))
        assert spec.metricSpecs
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetMetricSpec(ref(name="other", profile="mistral-7b-a100"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "one of llama3-8b-h200, mistral-7b-l40s, qwen2.5-32b-h200, or priors"
        in caught.value.details()
    )
    assert "'profile'='mistral-7b-a100'" in caught.value.details()


def test_the_scaler_plans_a_trigger_s_custom_profile():
    config = parse_config(config_text({"mine": profile_yaml(QWEN25_32B_H200)}))
    metadata = TriggerMetadata.model_validate(TRIGGER, context={"profiles": ["mine"]})
    assert profile_for(metadata.policy(config.policy_defaults())) == replace(
        QWEN25_32B_H200, name="mine"
    )


ROOT = Path(__file__).parent.parent

BAD = [
    pytest.param(
        {"llama3-8b-h200": profile_yaml(LLAMA3_8B_H200)},
        ["'llama3-8b-h200' is built in"],
        id="a name clashing with a built-in profile is refused",
    ),
    pytest.param(
        {"priors": profile_yaml(LLAMA3_8B_H200)},
        ["'priors' is built in"],
        id="the name that means no profile is refused",
    ),
    pytest.param(
        {"Mine_1": profile_yaml(LLAMA3_8B_H200)},
        ["profile name 'Mine_1'", "lowercase"],
        id="a name that is no lowercase label is refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"decode-ms": [0, 0.017, 0.00003]})},
        ["'profiles.mine.decode-ms.0'=0", "greater than or equal to 0.05"],
        id="a zero weight-read time per decode step is refused naming the coefficient",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"prefill-ms": [4.8, -0.02, 0.0]})},
        ["'profiles.mine.prefill-ms.1'=-0.02", "greater than or equal to 0.0001"],
        id="a negative prefill cost per token is refused naming the coefficient",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"decode-ms": [1e-9, 1e-9, 0]})},
        ["'profiles.mine.decode-ms.0'=1e-09", "greater than or equal to 0.05"],
        id="a step of a nanosecond is refused: every replica carried any load (pass 52)",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"decode-ms": [0.0057, 0.000017, 0]})},
        ["'profiles.mine.decode-ms.0'=0.0057", "greater than or equal to 0.05"],
        id="seconds given for milliseconds are refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"decode-ms": [5.7, 0.017]})},
        ["'profiles.mine.decode-ms.2'", "missing"],
        id="a decode fit with two coefficients is refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, colour="red")},
        ["unknown key 'profiles.mine.colour'"],
        id="an unknown field is refused naming it",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"price-per-hour": 0})},
        ["'profiles.mine.price-per-hour'=0"],
        id="a free accelerator is refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"price-per-hour": 1e9})},
        ["'profiles.mine.price-per-hour'=1000000000", "1000000"],
        id="a billion dollars an accelerator-hour is refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"engine-init": "2562047h"})},
        ["'profiles.mine.engine-init'", "3600"],
        id="an engine start of 292 years is refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"accelerator-memory-gb": 141})},
        ["give one of accelerator-memory-gb and accelerator-memory-bytes"],
        id="the memory given twice is refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"weights-gb": 140})},
        ["leave no KV cache"],
        id="weights that leave no KV cache are refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"max-num-seqs": 10**12})},
        ["'profiles.mine.max-num-seqs'=1000000000000", "16384"],
        id="seats by the trillion held a core for days each decision and are refused",
    ),
    pytest.param(
        {"mine": profile_yaml(LLAMA3_8B_H200, **{"max-num-batched-tokens": 10**8})},
        ["'profiles.mine.max-num-batched-tokens'=100000000"],
        id="a step budget past any context served is refused",
    ),
]


@pytest.mark.parametrize(("profiles", "fragments"), BAD)
def test_bad_profiles_are_refused_naming_the_key(profiles, fragments):
    with pytest.raises(ConfigError) as caught:
        parse_config(config_text(profiles))
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_the_policy_naming_no_defined_profile_is_refused_naming_the_known_ones():
    text = config_text({"mine": profile_yaml(LLAMA3_8B_H200)}, policy={"profile": "yours"})
    with pytest.raises(ConfigError, match=r"policy\.profile 'yours'.*llama3-8b-h200, mine, qwen"):
        parse_config(text)


@pytest.mark.parametrize(
    ("file_text", "inline", "fragments"),
    [
        pytest.param(
            config_text({"mine": profile_yaml(LLAMA3_8B_H200, **{"weights-gb": -1})}),
            {},
            ["profiles-file", "profiles.yaml", "'profiles.mine.weights-gb'=-1"],
            id="a bad number in the file is refused naming the file and the key",
        ),
        pytest.param(
            config_text({"mine": profile_yaml(LLAMA3_8B_H200)}),
            {"mine": profile_yaml(QWEN25_32B_H200)},
            ["'mine' is in both profiles and profiles-file"],
            id="a name in both the file and the config is refused",
        ),
        pytest.param(
            None,
            {},
            ["cannot read profiles-file"],
            id="a missing file is refused naming the key",
        ),
    ],
)
def test_a_bad_profiles_file_is_refused(tmp_path, file_text, inline, fragments):
    path = tmp_path / "profiles.yaml"
    if file_text is not None:
        path.write_text(file_text)
    with pytest.raises(ConfigError) as caught:
        parse_config(config_text(inline, **{"profiles-file": str(path)}))
    for fragment in fragments:
        assert fragment in str(caught.value)


def many(count: int, prefix: str = "p") -> dict[str, object]:
    return {f"{prefix}{i}": profile_yaml(LLAMA3_8B_H200) for i in range(count)}


@pytest.mark.parametrize(
    ("inline", "in_file", "refused"),
    [
        pytest.param(MAX_PROFILES, 0, None, id="the most profiles a config defines are taken"),
        pytest.param(MAX_PROFILES + 1, 0, "at most 256 items", id="one more is refused"),
        pytest.param(MAX_PROFILES, 1, "over 256 profiles", id="the file's count with the config's"),
        pytest.param(0, MAX_PROFILES + 1, "profiles-file", id="the file's own count alone"),
    ],
)
def test_a_config_defines_a_bounded_number_of_profiles(tmp_path, inline, in_file, refused):
    """65,000 profiles (a valid 1 MB config) cost 6.7 ms a decision, and held a reload's
    loop 5.4 s at 1,000 ScaledObjects (hostile pass 62)."""
    path = tmp_path / "profiles.yaml"
    path.write_text(config_text(many(in_file, "f")))
    text = config_text(many(inline), **({"profiles-file": str(path)} if in_file else {}))
    if refused is None:
        assert len(parse_config(text).policy_defaults().profiles) == inline + in_file
    else:
        with pytest.raises(ConfigError, match=refused):
            parse_config(text)


def test_a_profiles_file_adds_profiles_beside_the_configs(tmp_path):
    path = tmp_path / "profiles.yaml"
    path.write_text(config_text({"theirs": profile_yaml(QWEN25_32B_H200)}))
    text = config_text({"mine": profile_yaml(LLAMA3_8B_H200)}, **{"profiles-file": str(path)})
    names = [own.name for own in parse_config(text).policy_defaults().profiles]
    assert names == ["mine", "theirs"]


def test_the_configmap_example_profile_parses_when_uncommented():
    """The commented example in ``_example`` is a profile the scaler takes as written."""
    configmap = yaml.safe_load((ROOT / "deploy" / "scaler" / "configmap.yaml").read_text())
    section = configmap["data"]["_example"].split("profiles: {}\n", 1)[1]
    lines = [line[3:] for line in section.splitlines() if line.startswith("#  ")]
    config = parse_config("profiles:\n" + "\n".join("  " + line for line in lines))
    (profile,) = config.policy_defaults().profiles
    assert profile.name == "mistral-7b-l40s" and profile.name not in PROFILES
    assert profile.kv_capacity_tokens > 0


def test_a_replay_plans_with_the_scaler_config_s_own_profile():
    """``unitscale replay --scaler-config`` tries an SRE profile on a trace."""
    config = parse_config(
        config_text({"mine": profile_yaml(QWEN25_32B_H200)}, policy={"profile": "mine"})
    )
    options = ReplayOptions("t", 1.0, 1.0, 0, policy=config.policy_defaults())
    policy = make_policy("unitscale", SimConfig(LLAMA3_8B_H200), options)
    assert isinstance(policy, Unitscale)
    effective = TriggerMetadata.model_validate(policy.metadata).policy(policy.defaults)
    assert profile_for(effective) == replace(QWEN25_32B_H200, name="mine")


def test_the_docs_example_registers_a_profile_the_policy_names():
    """docs/capacity.md's "Registering it with the scaler" is a config the scaler takes."""
    docs = (ROOT / "docs" / "capacity.md").read_text()
    section = docs.split("### Registering it with the scaler", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    policy = parse_config(example).policy_defaults()
    planned = profile_for(policy)
    assert planned is not None and planned.name == "mistral-7b-l40s"
    assert replica_rates(policy, MIXES[0]).source == "profile mistral-7b-l40s"


def test_the_demo_refuses_a_scaler_config_planning_with_its_own_profile(tmp_path):
    """The demo's scaler gets the policy section alone: say so rather than fail later."""
    from unitscale.demo.run import DemoOptions, _plan

    path = tmp_path / "scaler.yaml"
    path.write_text(config_text({"mine": profile_yaml(LLAMA3_8B_H200)}, policy={"profile": "mine"}))
    options = DemoOptions(report=tmp_path / "report.md", scaler_config=path)
    with pytest.raises(ConfigError, match=r"built-in profiles only, not policy\.profile 'mine'"):
        _plan(options)
