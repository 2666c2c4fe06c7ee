"""The OpenAI-compatible server through the official `openai` client, as users run it: `python -m
eyas.engine.serve` in a subprocess on the shipped defaults. Greedy text must equal the offline engine's,
streamed text the non-streamed text; bad requests get a 4xx and leave the server healthy; cancelled
requests free their KV at once."""

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from support import build_engine
from support.server_process import MODEL, SERVED_PROMPTS, ServerProcess

from eyas import SamplingParams


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(cwd=tmp_path_factory.mktemp("serve"))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline():
    with build_engine([]) as engine:  # the same shipped defaults the server runs
        yield engine


def offline_texts(engine, prompts, **params) -> list[str]:
    return [o.text for o in engine.generate(prompts, SamplingParams(**params))]


def streamed_text(stream, field="text") -> tuple[str, str]:
    pieces, finish = [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.text if field == "text" else choice.delta.content
        pieces.append(piece or "")
        finish = choice.finish_reason or finish
    return "".join(pieces), finish


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert server.get("/health") == (200, '{"status":"ok"}')
    status, text = server.get("/metrics")
    assert status == 200 and "eyas_kv_pages_total" in text and "eyas_mean_accept_length" in text


def test_greedy_completions_equal_the_offline_engine_streamed_or_not(client, offline):
    expected = offline_texts(offline, SERVED_PROMPTS, max_new_tokens=40)
    for prompt, text in zip(SERVED_PROMPTS, expected):
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
        assert done.choices[0].text == text
        assert done.choices[0].finish_reason in ("length", "stop")
        assert done.usage.completion_tokens >= 1 and done.usage.prompt_tokens >= 1
        streamed, finish = streamed_text(client.completions.create(model=MODEL, prompt=prompt, max_tokens=40,
                                                                   temperature=0, stream=True))
        assert (streamed, finish) == (text, done.choices[0].finish_reason)


def test_unset_fields_take_the_sampling_config(client, offline):
    done = client.completions.create(model=MODEL, prompt=SERVED_PROMPTS[0])  # sampling/default: greedy, 128 tokens
    assert done.choices[0].text == offline_texts(offline, SERVED_PROMPTS[:1])[0]


def test_stop_strings_cut_streamed_and_non_streamed_text_alike(client, offline):
    for stop in (["\n"], ["current", "the"], ["\"\"\""]):
        expected = offline_texts(offline, SERVED_PROMPTS[:3], max_new_tokens=60, stop=stop)
        for prompt, text in zip(SERVED_PROMPTS[:3], expected):
            done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=60, temperature=0, stop=stop)
            streamed, _ = streamed_text(client.completions.create(model=MODEL, prompt=prompt, max_tokens=60,
                                                                  temperature=0, stop=stop, stream=True))
            assert done.choices[0].text == streamed == text
            assert not any(s in text for s in stop)


def test_seeded_sampling_repeats_and_equals_the_offline_engine(tmp_path):
    """Under `speculative.verify=reproducible` a seed fixes the text: the server's equals the offline
    engine's and repeats. (The default, rejection sampling, draws from the same distribution, but its
    tokens follow the drafts and the adaptive schedule.)"""
    reproducible = "speculative.verify=reproducible"
    params = dict(temperature=0.9, top_p=0.95, seed=1234)
    with build_engine([reproducible]) as engine:
        expected = offline_texts(engine, SERVED_PROMPTS[:2], max_new_tokens=30, top_k=50, **params)
    process = ServerProcess(reproducible, cwd=tmp_path)
    try:
        client = OpenAI(base_url=process.base + "/v1", api_key="unused", max_retries=0)
        for prompt, text in zip(SERVED_PROMPTS[:2], expected):
            runs = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, extra_body={"top_k": 50},
                                              **params).choices[0].text for _ in range(2)]
            assert runs == [text, text]
    finally:
        process.stop()


def test_token_id_prompts(client, offline):
    ids = offline.tokenizer.encode(SERVED_PROMPTS[1])
    done = client.completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0)
    assert done.choices[0].text == offline_texts(offline, SERVED_PROMPTS[1:2], max_new_tokens=20)[0]


def test_chat_completions_render_the_template(client, offline):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    rendered = "System: You write Python.\nUser: def add(a, b):\nAssistant:"
    expected = offline_texts(offline, [rendered], max_new_tokens=30, stop=["\nUser:"])[0]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == expected
    streamed, finish = streamed_text(client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}), field="delta")
    assert (streamed, finish) == (expected, done.choices[0].finish_reason)


BAD = [
    (dict(max_tokens=-1), "max_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(prompt=""), "prompt"),
    (dict(prompt=[]), "prompt"),
    (dict(prompt="x " * 3000), "prompt"),  # longer than the 2048-token context
    (dict(prompt=[0, 10**9]), "prompt"),
    (dict(prompt=["a", "b"]), "prompt"),
    (dict(n=0), "n"),
    (dict(n=65), "n"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(min_p=1.5), "min_p"),
    (dict(logprobs=21), "logprobs"),
    (dict(logit_bias={"abc": 1}), "logit_bias"),
    (dict(logit_bias={"\u00b2": 1}), "logit_bias"),  # a digit to str.isdigit, not to int()
    (dict(logit_bias={"5": 101}), "logit_bias.5"),
    (dict(logit_bias={"4096": 1}), "logit_bias"),  # past the shipped vocabulary
    (dict(stop_token_ids=[-1]), "stop_token_ids.0"),
    (dict(stop_token_ids=[5000]), "stop_token_ids"),
    (dict(seed=-3), "seed"),
    (dict(stop=[""]), "stop"),
    (dict(echo=True), "echo"),
    (dict(max_tokens=10**7), "max_tokens"),  # more KV than the whole pool
]


VLLM_FIELDS = {"min_p", "repetition_penalty", "stop_token_ids", "top_k", "ignore_eos"}


@pytest.mark.parametrize("fields,param", BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD)])
def test_invalid_completion_fields_are_refused_with_400(client, fields, param):
    extra = {k: v for k, v in fields.items() if k in VLLM_FIELDS}  # not in the openai client's signature
    request = {"model": MODEL, "prompt": "def f():", "max_tokens": 4,
               **{k: v for k, v in fields.items() if k not in extra}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**request, extra_body=extra)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"


def test_wrong_types_unknown_models_and_bad_bodies(server, client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert missing.value.body["code"] == "model_not_found"
    for body in ({"model": MODEL, "prompt": "x", "max_tokens": "5"}, {"model": MODEL, "prompt": 7},
                 {"model": MODEL, "prompt": "x", "temperature": "hot"}, {"prompt": "x"}, [1, 2], "not json",
                 {"model": MODEL, "prompt": "x", "stream": "yes"}, '{"model": "target", "prompt": "x", "temperature": Infinity}',
                 {"model": MODEL, "prompt": "x", "response_format": {"type": "json_schema", "json_schema": "s"}}):
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        status, reply = server.post("/v1/completions", raw)
        assert status == 400 and reply["error"]["message"], (body, reply)
    for body in ({"model": MODEL, "messages": []}, {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
                 {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}):
        assert server.post("/v1/chat/completions", json.dumps(body).encode())[0] == 400, body
    assert server.get("/health")[0] == 200
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].finish_reason == "length"


def test_a_cancelled_stream_frees_its_kv_at_once(server, client):
    aborted = server.metric('eyas_requests_total{finish_reason="abort"}') if "abort" in server.get("/metrics")[1] else 0
    stream = client.completions.create(model=MODEL, prompt=SERVED_PROMPTS[0], max_tokens=1500, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    assert server.metric("eyas_kv_pages_used") > 0
    stream.close()
    server.wait_idle(timeout_s=10)
    assert server.metric('eyas_requests_total{finish_reason="abort"}') == aborted + 1


def test_a_non_streaming_client_that_hangs_up_has_its_request_aborted(server):
    aborted = server.metric('eyas_requests_total{finish_reason="abort"}') if "abort" in server.get("/metrics")[1] else 0
    body = json.dumps({"model": MODEL, "prompt": SERVED_PROMPTS[2], "max_tokens": 1500, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 10
        while server.metric("eyas_kv_pages_used") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.metric("eyas_kv_pages_used") > 0  # it runs
    server.wait_idle(timeout_s=10)  # gone with its client, long before 1500 tokens
    assert server.metric('eyas_requests_total{finish_reason="abort"}') == aborted + 1


def test_64_concurrent_streaming_clients_some_cancelled(server, offline):
    """Every valid request completes with the offline engine's greedy text; every fourth is dropped
    midway; afterwards no request runs and the KV pool is empty."""
    prompts = [SERVED_PROMPTS[i % len(SERVED_PROMPTS)] + " " * (i % 3) for i in range(64)]
    lengths = [16 + (i * 7) % 33 for i in range(64)]
    expected = [o.text for o in offline.generate(prompts, [SamplingParams(max_new_tokens=n) for n in lengths])]

    async def one(client, i):
        stream = await client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lengths[i],
                                                 temperature=0, stream=True)
        pieces = []
        async for chunk in stream:
            pieces.append(chunk.choices[0].text)
            if i % 4 == 3 and len(pieces) == 2:
                await stream.close()
                return None
        return "".join(pieces)

    async def all_clients():
        async with AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    texts = asyncio.run(all_clients())
    for i, text in enumerate(texts):
        if i % 4 != 3:
            assert text == expected[i], i
    server.wait_idle(timeout_s=20)
    assert server.get("/health")[0] == 200


def test_full_queue_answers_503_and_api_key_is_required(tmp_path):
    server = ServerProcess("server.max_queue=1", "cache.max_running_requests=1", "server.api_key=sesame",
                           "server.served_model_name=tiny", cwd=tmp_path)
    try:
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0).models.list()
        client = OpenAI(base_url=server.base + "/v1", api_key="sesame", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        running = client.completions.create(model="tiny", prompt="def f():", max_tokens=1500, stream=True,
                                            extra_body={"ignore_eos": True})
        next(iter(running))  # it holds the one batch slot
        queued = threading.Thread(target=client.completions.create,
                                  kwargs=dict(model="tiny", prompt="import os", max_tokens=3))
        queued.start()
        while server.metric("eyas_requests_waiting") < 1:
            pass
        with pytest.raises(openai.InternalServerError) as busy:
            client.completions.create(model="tiny", prompt="x", max_tokens=2)
        assert busy.value.status_code == 503 and "server.max_queue" in busy.value.body["message"]
        running.close()
        queued.join(timeout=60)
        server.wait_idle()
    finally:
        server.stop()
    assert server.proc.returncode == 0  # SIGTERM: a clean shutdown


@pytest.mark.parametrize("override,message", [  # one server start each: the default run starts one
    ("server.port=70000", "server.port must be an integer in 1..65535"),
    pytest.param("server.log_level=loud", "server.log_level must be one of", marks=pytest.mark.slow),
    pytest.param("server.max_queue=0", "server.max_queue must be an integer >= 1", marks=pytest.mark.slow),
    pytest.param("server.chat_template.user=hi", "server.chat_template.user must contain '{content}'",
                 marks=pytest.mark.slow),
])
def test_bad_server_config_is_a_clear_error(tmp_path, override, message):
    done = subprocess.run([sys.executable, "-m", "eyas.launch.serve", override], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr, done.stderr
