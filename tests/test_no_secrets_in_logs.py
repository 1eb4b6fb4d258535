"""No prompt, completion or credential ever reaches a log line, at any level."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from tests.test_gateway import completion, start_gateway, start_sim, wait_ready

PROMPT = "PROMPT-MARKER-7f3a the user's private words"
TOKEN = "SECRET-MARKER-91c2"


@pytest.mark.parametrize(
    ("body", "stream"),
    [
        pytest.param(completion(prompt=PROMPT), False, id="a-served-request"),
        pytest.param(completion(prompt=PROMPT, stream=True), True, id="a-streamed-request"),
        pytest.param(completion(prompt=PROMPT, max_tokens=-1), False, id="a-refused-request"),
        pytest.param(completion(prompt=PROMPT, model="nobody"), False, id="an-unknown-model"),
    ],
)
async def test_prompts_and_credentials_stay_out_of_the_logs(caplog, body, stream):
    caplog.set_level(logging.DEBUG)
    sim = await start_sim()
    gateway = await start_gateway([sim.url])
    try:
        await wait_ready(gateway, 1)
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": TOKEN}
        url = f"http://127.0.0.1:{gateway.port}/v1/completions"
        async with aiohttp.ClientSession() as client:
            async with client.post(url, json=body, headers=headers) as response:
                await response.read()
    finally:
        await gateway.stop()
        await sim.stop()
    assert caplog.records, "nothing was logged: the check would prove nothing"
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "PROMPT-MARKER" not in text
    assert "SECRET-MARKER" not in text
