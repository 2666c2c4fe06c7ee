"""A forwarded request answered by an app in process: status, headers and the first body bytes together,
the rest as body parts; closing the parts is the client's hang-up; and what the prefix router matches."""

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from eyas.engine.serve.replicas.forwarding import ForwardedRequest, ResponseHead, answer, routing_text


def demo_app(seen: dict) -> FastAPI:
    app = FastAPI()

    @app.post("/plain")
    async def plain(request: Request):
        return JSONResponse({"echo": json.loads(await request.body())}, status_code=201)

    @app.post("/stream")
    async def stream():
        async def chunks():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.01)
            finally:
                seen["stream_closed"] = True

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def recording(scope, receive, send):  # what the app was told by the forwarding
        async def spy():
            message = await receive()
            seen.setdefault("received", []).append(message["type"])
            return message

        await app(scope, spy, send)

    return recording


def collect(app, request: ForwardedRequest, limit: int | None = None) -> list:
    async def run():
        parts = []
        generator = answer(app, request)
        async for part in generator:
            parts.append(part)
            if limit is not None and len(parts) >= limit:
                await generator.aclose()
                break
        return parts

    return asyncio.run(run())


def test_a_plain_answer_is_one_part():
    parts = collect(demo_app({}), ForwardedRequest("POST", "/plain", body=b'{"a": 1}'))
    (head,) = parts
    assert isinstance(head, ResponseHead) and head.status == 201 and not head.more
    assert json.loads(head.body) == {"echo": {"a": 1}}
    assert (b"content-type", b"application/json") in head.headers


def test_a_stream_comes_in_parts_and_closing_them_hangs_up():
    seen = {}
    parts = collect(demo_app(seen), ForwardedRequest("POST", "/stream"), limit=3)
    assert isinstance(parts[0], ResponseHead) and parts[0].more and parts[0].body == b"data: 0\n\n"
    assert parts[1:] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert seen.get("stream_closed")  # the app's stream was ended, not left running
    assert "http.disconnect" in seen["received"]  # ended by the hang-up it was told of, not by being cancelled


def test_an_unknown_path_is_the_apps_own_404():
    (head,) = collect(demo_app({}), ForwardedRequest("POST", "/nowhere"))
    assert head.status == 404


def test_the_routing_text_is_the_prompt_or_the_messages():
    assert routing_text("/v1/completions", b'{"prompt": "abc", "max_tokens": 3}') == "abc"
    assert routing_text("/v1/completions", b'{"prompt": ["first", "second"]}') == "first"
    chat = routing_text("/v1/chat/completions", b'{"messages": [{"role": "system", "content": "S"}]}')
    assert chat.startswith('[{"role": "system", "content": "S"')
    turns = [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "q"}]
    first = routing_text("/v1/chat/completions", json.dumps({"messages": turns}).encode())
    later = routing_text("/v1/chat/completions", json.dumps({"messages": [
        *turns, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]}).encode())
    assert later.startswith(first[:-1])  # a conversation's text extends its earlier turns' text
    assert routing_text("/v1/completions", b"not json") == ""
    assert routing_text("/v1/completions", b"[1, 2]") == ""
