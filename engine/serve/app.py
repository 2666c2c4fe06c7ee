"""The HTTP app: OpenAI completions, chat completions and models; health and Prometheus metrics.

Every request is parsed and checked here before it reaches the engine loop: a bad one is answered
with a 4xx and an OpenAI-style error body. Hostile input costs little: a body over `max_body_bytes`
is refused (413) before it is read, and one that cannot fit the context is refused before it is
tokenized; parsing and tokenizing run off the event loop, so no request waits on another's. Streams are server-sent events in the
OpenAI chunk format ending with `data: [DONE]`; a client that goes away (streaming or not) has its
request aborted and its KV freed.
"""

import asyncio
import hmac
import json
import re
import time
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from eyas.engine.errors import ConfigError
from eyas.engine.outputs import RequestOutput
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.chat_template import ChatTemplate, ChatTemplateError
from eyas.engine.serve.detokenizer import IncrementalDetokenizer
from eyas.engine.serve.loop import EngineLoop, Finished, QueueFull, Stream
from eyas.engine.serve.metrics import ServerMetrics
from eyas.engine.serve.protocol import (
    ChatCompletionRequest, CompletionRequest, RequestValidationError, chat_body, chat_choice, chat_chunk,
    chat_logprobs, completion_body, completion_choice, completion_logprobs, error_body, new_id, usage,
)
from eyas.engine.tokenizer import Tokenizer

DISCONNECT_POLL_S = 0.2


def create_app(loop: EngineLoop, metrics: ServerMetrics, tokenizer: Tokenizer, model_name: str, vocab_size: int,
               context_len: int, defaults: SamplingParams, chat_template: ChatTemplate,
               api_key: str | None = None, max_body_bytes: int = 8 << 20) -> FastAPI:
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
        given = request.headers.get("authorization", "").encode()
        if api_key and not hmac.compare_digest(given, f"Bearer {api_key}".encode()):  # in constant time
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
        await _compiled(req)
        prompt = req.single_prompt()
        ids = await _encode(prompt, "prompt") if isinstance(prompt, str) else _checked_ids(prompt)
        streams = _submit(req, ids, _sampling(req))
        rid = new_id("cmpl")

        def logprobs(entries, offset):
            return None if req.logprobs is None else completion_logprobs(entries, tokenizer.token_text, offset)

        if req.stream:
            def chunk(index, text, finish_reason, entries, offset):
                return completion_body(rid, model_name, [completion_choice(index, text, finish_reason,
                                                                           logprobs(entries, offset))], chunk=True)

            def last(outputs):
                body = completion_body(rid, model_name, [], chunk=True, use=_usage(ids, outputs))
                return [body]  # the usage chunk carries no choice, as OpenAI sends it

            return _sse(request, streams, chunk, last if _include_usage(req) else None, first=None)
        outputs = await _final_outputs(request, streams)
        choices = [completion_choice(i, o.text, o.finish_reason, logprobs(_text_logprobs(o), 0))
                   for i, o in enumerate(outputs)]
        return completion_body(rid, model_name, choices, chunk=False, use=_usage(ids, outputs))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await _parse(request, ChatCompletionRequest)
        await _compiled(req)
        try:
            text = chat_template.render(req.conversation())
        except ChatTemplateError as e:
            raise RequestValidationError(str(e), "messages") from e
        ids = await _encode(text, "messages")
        streams = _submit(req, ids, _sampling(req, chat_template.stop))
        rid = new_id("chatcmpl")

        def logprobs(entries):
            return chat_logprobs(entries, tokenizer.token_text) if req.logprobs else None

        if req.stream:
            def chunk(index, text, finish_reason, entries, offset):
                delta = {"content": text} if text or finish_reason is None else {}
                return chat_chunk(rid, model_name, index, delta, finish_reason, logprobs(entries))

            def last(outputs):
                body = chat_chunk(rid, model_name, 0, {}, None)
                body["choices"], body["usage"] = [], _usage(ids, outputs)
                return [body]

            first = [chat_chunk(rid, model_name, i, {"role": "assistant", "content": ""}, None) for i in range(req.n)]
            return _sse(request, streams, chunk, last if _include_usage(req) else None, first=first)
        outputs = await _final_outputs(request, streams)
        body = chat_body(rid, model_name, [chat_choice(i, o.text, o.finish_reason, logprobs(_text_logprobs(o)))
                                           for i, o in enumerate(outputs)])
        body["usage"] = _usage(ids, outputs)
        return body

    # ---- helpers (closures over the app's engine loop and settings) ----

    async def _parse(request: Request, model: type[BaseModel]):
        authorize(request)
        raw = await _body(request)
        try:
            req = await asyncio.to_thread(model.model_validate_json, raw or b"null")
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

    async def _body(request: Request) -> bytes:
        """The body, refused (413) past `max_body_bytes`: by its declared length before a byte is read."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise _too_large(int(declared))
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > max_body_bytes:
                raise _too_large(len(body))
        return bytes(body)

    def _too_large(size: int) -> RequestValidationError:
        return RequestValidationError(f"request body of {size} bytes exceeds server.max_body_bytes = {max_body_bytes}",
                                      None, status=413, code="request_too_large")

    # a token's text is at most this long: text past context_len tokens of it cannot fit (x4 for normalizers)
    longest_prompt_chars = 4 * context_len * tokenizer.max_token_chars

    async def _encode(text: str, param: str) -> list[int]:
        """Token ids of a text prompt, tokenized off the event loop; text too long to fit is refused unread."""
        if len(text) > longest_prompt_chars:
            raise RequestValidationError(f"{param} of {len(text)} characters cannot fit the context of {context_len} "
                                         "tokens", param)
        return await asyncio.to_thread(tokenizer.encode, text)

    def _checked_ids(ids: list[int]) -> list[int]:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise RequestValidationError(f"prompt token ids must be in [0, {vocab_size}), got {bad[0]}", "prompt")
        return ids

    def _sampling(req, extra_stop=()) -> SamplingParams:
        try:
            params = req.sampling_params(defaults, list(extra_stop))
            params.check_vocabulary(vocab_size)
        except ConfigError as e:
            message = str(e)
            named = re.match(r"sampling\.(\w+)", message)
            raise RequestValidationError(message.replace("sampling.", "", 1), named and named.group(1)) from None
        return params

    async def _compiled(req) -> None:
        """A request's grammar compiled (and cached) before it reaches the loop, off the event loop: one
        that cannot compile is refused here."""
        spec, field = req.structured_output()
        if spec is not None:
            try:
                await asyncio.to_thread(loop.engine.grammars.check, spec, field)
            except ConfigError as e:
                raise RequestValidationError(str(e), field) from None

    def _submit(req, ids: list[int], params: SamplingParams) -> list[Stream]:
        """The request's n samples, each a Stream of one engine request, sharing one event queue."""
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
        if params.n > loop.max_queue:
            raise RequestValidationError(f"n = {params.n} samples can never wait at once: server.max_queue is "
                                         f"{loop.max_queue}", "n")
        events = asyncio.Queue()
        streams = [Stream(ids, replace(params, n=1, seed=None if params.seed is None else (params.seed + i) % 2**64),
                          index=i, events=events) for i in range(params.n)]
        try:
            loop.submit_all(streams)
        except QueueFull as e:
            raise RequestValidationError(f"server busy: {e}; retry later", None, status=503) from None
        return streams

    def _include_usage(req) -> bool:
        return bool(req.stream_options and req.stream_options.include_usage)

    def _usage(ids: list[int], outputs: list[RequestOutput]) -> dict:
        cached = max((o.stats.get("cached_tokens", 0) for o in outputs), default=0)
        return usage(len(ids), sum(len(o.token_ids) for o in outputs), cached)

    def _text_logprobs(output: RequestOutput) -> list:
        """The logprobs of the tokens the text shows: a stop token's or one past a stop string's are cut."""
        entries = output.logprobs or []
        if output.finish_reason == "stop" and entries and tokenizer.decode(output.token_ids) != output.text:
            shown = len(output.token_ids)
            while shown > 0 and len(tokenizer.decode(output.token_ids[:shown - 1])) >= len(output.text):
                shown -= 1
            entries = entries[:shown]
        return entries

    def _abort_all(streams: list[Stream]) -> None:
        for stream in streams:
            loop.abort(stream)

    async def _final_outputs(request: Request, streams: list[Stream]) -> list[RequestOutput]:
        """Every sample's output, in index order (the choice index), once all have finished."""
        events, outputs = streams[0].events, {}
        checked = time.monotonic()
        while len(outputs) < len(streams):
            try:
                index, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                index, event = None, None
            if isinstance(event, Finished):
                if event.output.finish_reason == "error":
                    _abort_all(streams)
                    raise RequestValidationError(event.output.error, None, status=500)
                outputs[index] = event.output
            if time.monotonic() - checked >= DISCONNECT_POLL_S:  # tokens arrive every step: check by the clock
                checked = time.monotonic()
                if await request.is_disconnected():
                    _abort_all(streams)
                    raise RequestValidationError("client closed the request", None, status=499)
        return [outputs[i] for i in range(len(streams))]

    def _sse(request: Request, streams: list[Stream], chunk, last, first) -> StreamingResponse:
        """chunk(index, text, finish_reason, logprob entries, text offset) -> a chunk body; last(outputs) ->
        the bodies after every sample finished (None: none); first: bodies sent before any token."""
        stops = streams[0].params.stop
        detokenizers = [IncrementalDetokenizer(tokenizer, stops) for _ in streams]
        # per sample: logprobs not sent yet, each event's with the text length its tokens reach; an
        # event's go out once all of its text has (text held back for a stop string holds them too)
        pending: list[list[tuple[list, int]]] = [[] for _ in streams]
        num_sent = [0] * len(streams)  # per sample: logprob entries sent
        text_sent = [0] * len(streams)  # per sample: characters sent (the next chunk's text offset)
        finished: dict[int, RequestOutput] = {}

        def piece_chunk(index: int, text: str, finish_reason):
            reached = len(detokenizers[index].sent)
            entries = [e for group, end in pending[index] if end <= reached for e in group]
            pending[index] = [(group, end) for group, end in pending[index] if end > reached]
            body = chunk(index, text, finish_reason, entries, text_sent[index])
            num_sent[index] += len(entries)
            text_sent[index] += len(text)
            return _data(body)

        async def events():
            try:
                for body in first or []:
                    yield _data(body)
                while len(finished) < len(streams):
                    index, event = await streams[0].events.get()
                    if isinstance(event, Finished):
                        output = event.output
                        if output.finish_reason == "error":
                            yield _data(error_body(output.error, None, "server_error"))
                            yield "data: [DONE]\n\n"
                            return
                        finished[index] = output
                        pending[index] = [(_text_logprobs(output)[num_sent[index]:], 0)]
                        yield piece_chunk(index, detokenizers[index].finish(output.text), output.finish_reason)
                        continue
                    piece = detokenizers[index].add(event.ids)
                    pending[index].append((event.logprobs or [], detokenizers[index].text_len))
                    if piece:
                        yield piece_chunk(index, piece, None)
                for body in (last([finished[i] for i in range(len(streams))]) if last else []):
                    yield _data(body)
                yield "data: [DONE]\n\n"
            finally:  # the client went away (or the streams ended): nothing is left running
                _abort_all(streams)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def _data(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
