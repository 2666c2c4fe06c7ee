"""The server with the prefix cache, as users run it (`python -m eyas.launch.serve` on the shipped defaults,
speculation on): a shared prefix is reused and reported as OpenAI does, with the offline engine's
text; hostile bodies are refused before they cost anything; and a soak of random valid and invalid
requests, cancellations and hang-ups leaves the server healthy with no KV page held."""

import asyncio
import json
import random
import socket

import pytest
from openai import OpenAI
from support import build_engine
from support.server_process import ServerProcess, read_reply

from eyas import SamplingParams

MODEL = "target"
PREFIX = "".join(f"def step_{i}(state, value):\n    state.total += value * {i}\n    return state\n\n" for i in range(12))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(cwd=tmp_path_factory.mktemp("serve_prefix"))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_a_shared_prefix_is_reused_and_reported_with_the_offline_engines_text(server, client):
    cold = client.completions.create(model=MODEL, prompt=PREFIX + "def first(x):", max_tokens=12, temperature=0)
    warm = client.completions.create(model=MODEL, prompt=PREFIX + "class Second:", max_tokens=12, temperature=0)
    with build_engine([]) as offline:
        expected = offline.generate([PREFIX + "class Second:"], SamplingParams(max_new_tokens=12))[0]
    assert warm.choices[0].text == expected.text
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    prefix_tokens = len(expected.prompt_token_ids) - 4
    assert prefix_tokens - 16 <= warm.usage.prompt_tokens_details.cached_tokens < warm.usage.prompt_tokens
    chat = [{"role": "user", "content": PREFIX}]
    first = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=6, temperature=0)
    chat += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "go on"}]
    second = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=6, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    server.wait_idle()
    assert server.metric("eyas_prefix_cache_hit_rate") > 0 and server.metric("eyas_kv_pages_cached") > 0
    assert server.metric("eyas_prompt_tokens_cached_total") >= warm.usage.prompt_tokens_details.cached_tokens


def _raw(server, head: bytes, body: bytes = b"", read_after: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_after) as conn:
        conn.sendall(head + body)
        return read_reply(conn)


def test_bodies_over_the_limit_are_refused_before_they_are_read_and_block_nobody(server, client):
    declared = 20_000_000
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as upload:
        upload.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       + f"Content-Length: {declared}\r\n\r\n".encode() + b'{"model": "target", "prompt": "' + b"x" * 4096)
        # the upload stalls, unfinished: another client is served meanwhile
        small = client.completions.create(model=MODEL, prompt="def f():", max_tokens=8, temperature=0)
        assert small.choices[0].finish_reason in ("stop", "length")
        reply = read_reply(upload)
    assert reply.startswith(b"HTTP/1.1 413") and b"server.max_body_bytes" in reply
    # no declared length (chunked): refused once the limit is passed
    chunk = b"x" * (1 << 20)
    chunks = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(9)) + b"0\r\n\r\n"
    reply = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n", chunks)
    assert reply.startswith(b"HTTP/1.1 413")
    # under the limit, but a text that cannot fit the context: refused by its length, without tokenizing it
    status, body = server.post("/v1/completions", json.dumps({"model": MODEL, "prompt": "ab " * 2_000_000}).encode())
    assert status == 400 and body["error"]["param"] == "prompt" and "characters cannot fit" in body["error"]["message"]
    server.wait_idle()
    assert server.get("/health")[0] == 200


def _soak_request(rng: random.Random, prefixes: list[str]) -> tuple[str, dict | bytes, str]:
    """(kind, body, path): kind says what the reply must be."""
    kind = rng.choices(["complete", "stream", "cancel", "hang_up", "not_json", "bad_field", "too_large", "chat"],
                       [30, 25, 10, 8, 7, 8, 4, 8])[0]
    prompt = (rng.choice(prefixes) if rng.random() < 0.6 else "") + rng.choice(["def f(x):", "import os\n", "for i in"])
    body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randrange(1, 12),
            "temperature": rng.choice([0.0, 0.0, 0.8]), "seed": rng.randrange(1000)}
    if rng.random() < 0.3:
        body["stop"] = [rng.choice(["\n", "(", " "])]
    if kind == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": body["max_tokens"],
                "stream": rng.random() < 0.5}
        return kind, body, "/v1/chat/completions"
    if kind == "not_json":
        return kind, rng.choice([b"{", b"hello", b'{"model": "target", "prompt": }', b"\xff\xfe"]), "/v1/completions"
    if kind == "bad_field":
        body[rng.choice(["temperature", "top_p", "max_tokens", "n"])] = rng.choice([-1, "x"])
    if kind in ("stream", "cancel"):
        body["stream"] = True
    return kind, body, "/v1/completions"


async def _http(server, path: str, content: bytes, declared: int | None = None, read: str = "all",
                wait_s: float = 0.0) -> tuple[int, bytes]:
    """One HTTP/1.1 request on its own connection. read: "all" (the whole reply), "first" (the status line
    and the first bytes of the body, then hang up) or "none" (hang up after `wait_s`, before any reply)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    length = len(content) if declared is None else declared
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode() + content)
    await writer.drain()
    try:
        if read == "none":
            await asyncio.sleep(wait_s)
            return 0, b""
        if read == "first":
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.read(64)
            return int(head.split()[1]), b""
        reply = await reader.read()
        head, _, body = reply.partition(b"\r\n\r\n")
        return int(head.split()[1]), body
    finally:
        writer.close()


async def _soak(server, count: int, seed: int) -> dict:
    rng = random.Random(seed)
    prefixes = [PREFIX[: 200 * (i + 1)] for i in range(4)]
    requests = [(*_soak_request(rng, prefixes), rng.random()) for _ in range(count)]
    gate = asyncio.Semaphore(12)
    seen: dict[str, int] = {}

    async def one(kind: str, body, path: str, draw: float) -> None:
        async with gate:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            streamed = isinstance(body, dict) and body.get("stream")
            if kind == "too_large":  # declared only: refused before the body is read
                status, _ = await _http(server, path, content[:64], declared=9 << 20)
                assert status == 413
            elif kind == "hang_up":
                await _http(server, path, content, read="none", wait_s=0.05 + 0.3 * draw)
            elif kind == "cancel":
                status, _ = await _http(server, path, content, read="first")
                assert status == 200
            else:
                status, reply = await _http(server, path, content)
                if kind in ("not_json", "bad_field"):
                    assert status == 400, (body, reply[:300])
                elif streamed:  # chunked event stream: the last event is [DONE], none is an error
                    assert status == 200 and b"data: [DONE]" in reply and b'"error"' not in reply, reply[-300:]
                else:
                    assert status == 200, reply[:300]
                    assert json.loads(reply)["choices"][0]["finish_reason"] in ("stop", "length")
            seen[kind] = seen.get(kind, 0) + 1

    await asyncio.gather(*(one(*r) for r in requests))
    return seen


def _soaked(server, count: int, seed: int) -> None:
    seen = asyncio.run(_soak(server, count, seed))
    assert sum(seen.values()) == count and len(seen) == 8
    server.wait_idle(timeout_s=60)
    assert server.get("/health")[0] == 200
    assert server.metric("eyas_kv_pages_used") == 0  # no page held: every cached one is unreferenced
    assert server.metric("eyas_kv_pages_cached") > 0


def test_a_soak_of_random_requests_leaves_the_server_healthy_and_every_page_free(server):
    _soaked(server, 300, seed=1)


@pytest.mark.slow
def test_a_soak_of_ten_thousand_requests(tmp_path):
    server = ServerProcess(cwd=tmp_path)
    try:
        _soaked(server, 10_000, seed=2)
    finally:
        server.stop()
    assert server.proc.returncode == 0
