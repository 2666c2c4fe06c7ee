"""The server's endpoints: OpenAI completions, chat completions and models; health and Prometheus metrics.

Each OpenAI endpoint reads as its steps: the request checked (`RequestParser`), its `n` samples
submitted to the engine loop, then answered whole or as a stream (`streaming`) in the OpenAI format
(`openai_format`). `create_app` registers the methods as routes.
"""

import asyncio
import time
from dataclasses import replace
from typing import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from eyas.engine.chat_template import ChatTemplate, ChatTemplateError
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.serve.loop import EngineLoop, QueueFull, Stream
from eyas.engine.serve.metrics import ServerMetrics
from eyas.engine.serve.openai_format import ChatCompletionFormat, CompletionFormat, include_usage
from eyas.engine.serve.protocol import ChatCompletionRequest, CompletionRequest, RequestValidationError, new_id
from eyas.engine.serve.request_parsing import RequestParser
from eyas.engine.serve.streaming import final_outputs, sse_response
from eyas.engine.tokenizer import Tokenizer


class OpenAIRoutes:
    """The endpoints over one engine loop. `authorize(request)` refuses a /v1 request without the API key."""

    def __init__(self, loop: EngineLoop, metrics: ServerMetrics, tokenizer: Tokenizer, parser: RequestParser,
                 chat_template: ChatTemplate, authorize: Callable[[Request], None]):
        self.loop, self.metrics, self.tokenizer, self.parser = loop, metrics, tokenizer, parser
        self.chat_template, self.authorize = chat_template, authorize
        self.model_name, self.context_len = parser.model_name, parser.context_len
        self.created = int(time.time())

    # the endpoints carry no docstring or return annotation: FastAPI would put the one into /openapi.json
    # and take the other for a response model
    async def health(self):
        if self.loop.alive:
            return {"status": "ok"}
        return JSONResponse({"status": "engine loop stopped"}, status_code=503)

    async def prometheus(self):
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def models(self, request: Request):
        self.authorize(request)
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "eyas", "max_model_len": self.context_len}]}

    async def completions(self, request: Request):
        self.authorize(request)
        req = await self.parser.parse(request, CompletionRequest)
        await self.parser.check_grammar(req, self.loop.engine.grammars)
        ids = await self.parser.prompt_ids(req.single_prompt())
        streams = self.submit(req, ids, self.parser.sampling_params(req))
        response = CompletionFormat(new_id("cmpl"), self.model_name, self.tokenizer, req, ids)
        if req.stream:
            last = response.usage_chunks if include_usage(req) else None
            return sse_response(self.loop, self.tokenizer, streams, response.chunk, last, first=None)
        return response.body(await final_outputs(request, self.loop, streams))

    async def chat_completions(self, request: Request):
        self.authorize(request)
        req = await self.parser.parse(request, ChatCompletionRequest)
        await self.parser.check_grammar(req, self.loop.engine.grammars)
        try:
            text = self.chat_template.render(req.conversation())
        except ChatTemplateError as e:
            raise RequestValidationError(str(e), "messages") from e
        ids = await self.parser.encode(text, "messages")
        streams = self.submit(req, ids, self.parser.sampling_params(req, self.chat_template.stop))
        response = ChatCompletionFormat(new_id("chatcmpl"), self.model_name, self.tokenizer, req, ids)
        if req.stream:
            last = response.usage_chunks if include_usage(req) else None
            return sse_response(self.loop, self.tokenizer, streams, response.chunk, last, first=response.first_chunks())
        return response.body(await final_outputs(request, self.loop, streams))

    def submit(self, req, ids: list[int], params: SamplingParams) -> list[Stream]:
        """The request's n samples, each a Stream of one engine request, sharing one event queue."""
        self.parser.fit_to_context(req, ids, params)
        error = self.loop.admission_error(ids, params)
        if error:
            raise RequestValidationError(error.replace("lower max_new_tokens", "lower max_tokens"), "max_tokens")
        if params.n > self.loop.max_queue:
            raise RequestValidationError(f"n = {params.n} samples can never wait at once: server.max_queue is "
                                         f"{self.loop.max_queue}", "n")
        events = asyncio.Queue()
        streams = [Stream(ids, replace(params, n=1, seed=None if params.seed is None else (params.seed + i) % 2**64),
                          index=i, events=events) for i in range(params.n)]
        try:
            self.loop.submit_all(streams)
        except QueueFull as e:
            raise RequestValidationError(f"server busy: {e}; retry later", None, status=503) from None
        return streams
