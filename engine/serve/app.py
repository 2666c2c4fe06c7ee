"""The HTTP app: OpenAI completions, chat completions and models; health and Prometheus metrics.

Every request is parsed and checked here, on the event loop, before it reaches the engine loop: a
bad one is answered with a 4xx and an OpenAI-style error body. Streams are server-sent events in the
OpenAI chunk format ending with `data: [DONE]`; a client that goes away (streaming or not) has its
request aborted and its KV freed.
"""

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from engine.errors import ConfigError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.serve.chat_template import ChatTemplate
from engine.serve.detokenizer import IncrementalDetokenizer
from engine.serve.loop import EngineLoop, Finished, QueueFull, Stream
from engine.serve.metrics import ServerMetrics
from engine.serve.protocol import (
    ChatCompletionRequest, CompletionRequest, RequestValidationError, chat_body, chat_chunk, completion_body,
    error_body, new_id, usage,
)
from engine.tokenizer import Tokenizer

DISCONNECT_POLL_S = 0.2


def create_app(loop: EngineLoop, metrics: ServerMetrics, tokenizer: Tokenizer, model_name: str, vocab_size: int,
               context_len: int, defaults: SamplingParams, chat_template: ChatTemplate,
               api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="eyas", docs_url=None, redoc_url=None)
    app.state.loop, app.state.model_name = loop, model_name
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def refused(_, e: RequestValidationError):
        metrics.refused.labels(str(e.status)).inc()
        err_type = "invalid_request_error" if e.status < 500 else "server_error"
        if e.status == 401:
            err_type = "authentication_error"
        return JSONResponse(error_body(e.message, e.param, err_type, e.code), status_code=e.status)

    def authorize(request: Request) -> None:
        # a check in each /v1 handler, not an HTTP middleware: those hide a client's disconnect from the handler
        if api_key and request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise RequestValidationError("missing or wrong API key (Authorization: Bearer ...)", None, status=401,
                                         code="invalid_api_key")

    @app.get("/health")
    async def health():
        if loop.alive:
            return {"status": "ok"}
        return JSONResponse({"status": "engine loop stopped"}, status_code=503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "eyas", "max_model_len": context_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest)
        prompt = req.single_prompt()
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else _checked_ids(prompt)
        stream = _submit(req, ids, _sampling(req))
        rid = new_id("cmpl")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            def chunk(text, finish_reason, output):
                return completion_body(rid, model_name, text, finish_reason, chunk=True)

            def last(output):
                if not include_usage:
                    return []
                body = completion_body(rid, model_name, "", None, chunk=True, use=usage(len(ids), len(output.token_ids)))
                body["choices"] = []  # the usage chunk carries no choice, as OpenAI sends it
                return [body]

            return _sse(request, stream, chunk, last, first=None)
        output = await _final_output(request, stream)
        return completion_body(rid, model_name, output.text, output.finish_reason, chunk=False,
                               use=usage(len(ids), len(output.token_ids)))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await _parse(request, ChatCompletionRequest)
        ids = tokenizer.encode(chat_template.render(req.conversation()))
        stream = _submit(req, ids, _sampling(req, chat_template.stop))
        rid = new_id("chatcmpl")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            def chunk(text, finish_reason, output):
                return chat_chunk(rid, model_name, {"content": text} if text or finish_reason is None else {},
                                  finish_reason)

            def last(output):
                if not include_usage:
                    return []
                body = chat_chunk(rid, model_name, {}, None)
                body["choices"], body["usage"] = [], usage(len(ids), len(output.token_ids))
                return [body]

            return _sse(request, stream, chunk, last, first=chat_chunk(rid, model_name,
                                                                         {"role": "assistant", "content": ""}, None))
        output = await _final_output(request, stream)
        body = chat_body(rid, model_name, output.text, output.finish_reason)
        body["usage"] = usage(len(ids), len(output.token_ids))
        return body

    # ---- helpers (closures over the app's engine loop and settings) ----

    async def _parse(request: Request, model: type[BaseModel]):
        authorize(request)
        raw = await request.body()
        try:
            req = model.model_validate_json(raw or b"null")
        except ValidationError as e:
            first = e.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            where = f"{param}: " if param else "request body: "
            raise RequestValidationError(f"{where}{first['msg']}", param) from None
        if req.model != model_name:
            raise RequestValidationError(f"model {req.model!r} does not exist; this server serves {model_name!r}",
                                         "model", status=404, code="model_not_found")
        req.check_supported()
        return req

    def _checked_ids(ids: list[int]) -> list[int]:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise RequestValidationError(f"prompt token ids must be in [0, {vocab_size}), got {bad[0]}", "prompt")
        return ids

    def _sampling(req, extra_stop=()) -> SamplingParams:
        try:
            return req.sampling_params(defaults, list(extra_stop))
        except ConfigError as e:
            raise RequestValidationError(str(e).replace("sampling.", "", 1)) from None

    def _submit(req, ids: list[int], params: SamplingParams) -> Stream:
        if not ids:
            raise RequestValidationError("prompt encodes to no tokens", "prompt")
        if len(ids) >= context_len:
            raise RequestValidationError(f"prompt has {len(ids)} tokens; the context holds {context_len}, so it must "
                                         f"be shorter than {context_len}", "prompt")
        room = context_len - len(ids)
        if req.max_tokens is None:
            params.max_new_tokens = min(params.max_new_tokens, room)
        elif req.max_tokens > room:
            raise RequestValidationError(f"prompt ({len(ids)} tokens) + max_tokens ({req.max_tokens}) exceeds the "
                                         f"context of {context_len} tokens: max_tokens may be at most {room}",
                                         "max_tokens")
        error = loop.admission_error(ids, params)
        if error:
            raise RequestValidationError(error.replace("lower max_new_tokens", "lower max_tokens"), "max_tokens")
        stream = Stream(ids, params)
        try:
            loop.submit(stream)
        except QueueFull as e:
            raise RequestValidationError(f"server busy: {e}; retry later", None, status=503) from None
        return stream

    async def _final_output(request: Request, stream: Stream) -> RequestOutput:
        checked = time.monotonic()
        while True:
            try:
                event = await asyncio.wait_for(stream.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                event = None
            if isinstance(event, Finished):
                if event.output.finish_reason == "error":
                    raise RequestValidationError(event.output.error, None, status=500)
                return event.output
            if time.monotonic() - checked >= DISCONNECT_POLL_S:  # tokens arrive every step: check by the clock
                checked = time.monotonic()
                if await request.is_disconnected():
                    loop.abort(stream)
                    raise RequestValidationError("client closed the request", None, status=499)

    def _sse(request: Request, stream: Stream, chunk, last, first) -> StreamingResponse:
        detokenizer = IncrementalDetokenizer(tokenizer, stream.params.stop)

        async def events():
            try:
                if first is not None:
                    yield _data(first)
                while True:
                    event = await stream.events.get()
                    if isinstance(event, Finished):
                        output = event.output
                        if output.finish_reason == "error":
                            yield _data(error_body(output.error, None, "server_error"))
                        else:
                            yield _data(chunk(detokenizer.finish(output.text), output.finish_reason, output))
                            for body in last(output):
                                yield _data(body)
                        yield "data: [DONE]\n\n"
                        return
                    piece = detokenizer.add(event)
                    if piece:
                        yield _data(chunk(piece, None, None))
            finally:  # the client went away (or the stream ended): nothing is left running
                loop.abort(stream)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def _data(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
