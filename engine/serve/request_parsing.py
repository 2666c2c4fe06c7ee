"""From an HTTP request to what the engine takes: a checked request model, prompt token ids and
`SamplingParams`, or a `RequestValidationError` that names the field (answered with a 4xx).

Hostile input costs little here: a body over `max_body_bytes` is refused (413) before it is read, and
a prompt that cannot fit the context is refused before it is tokenized; parsing, tokenizing and grammar
compiling run off the event loop, so no request waits on another's.
"""

import asyncio
import re

from fastapi import Request
from pydantic import BaseModel, ValidationError

from eyas.engine.errors import ConfigError
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.serve.protocol import RequestValidationError
from eyas.engine.tokenizer import Tokenizer


class RequestParser:
    """The server's limits on a request: its body size, its model name, the vocabulary and the context."""

    def __init__(self, tokenizer: Tokenizer, model_name: str, vocab_size: int, context_len: int,
                 defaults: SamplingParams, max_body_bytes: int):
        self.tokenizer, self.model_name, self.vocab_size = tokenizer, model_name, vocab_size
        self.context_len, self.defaults, self.max_body_bytes = context_len, defaults, max_body_bytes
        # a token's text is at most this long: text past context_len tokens of it cannot fit (x4 for normalizers)
        self.longest_prompt_chars = 4 * context_len * tokenizer.max_token_chars

    async def parse(self, request: Request, model: type[BaseModel]):
        """The body as a `model` request for this server's model, its unsupported fields refused."""
        raw = await self.read_body(request)
        try:
            req = await asyncio.to_thread(model.model_validate_json, raw or b"null")
        except ValidationError as e:
            first = e.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            where = f"{param}: " if param else "request body: "
            raise RequestValidationError(f"{where}{first['msg']}", param) from None
        if req.model != self.model_name:
            raise RequestValidationError(f"model {req.model!r} does not exist; this server serves "
                                         f"{self.model_name!r}", "model", status=404, code="model_not_found")
        req.check_supported()
        return req

    async def read_body(self, request: Request) -> bytes:
        return await read_body(request, self.max_body_bytes)

    async def check_grammar(self, req, grammars) -> None:
        """A request's grammar compiled (and cached) before it reaches the loop, off the event loop: one
        that cannot compile is refused here."""
        spec, field = req.structured_output()
        if spec is not None:
            try:
                await asyncio.to_thread(grammars.check, spec, field)
            except ConfigError as e:
                raise RequestValidationError(str(e), field) from None

    async def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A completion's prompt as token ids: text tokenized, token ids checked against the vocabulary."""
        return await self.encode(prompt, "prompt") if isinstance(prompt, str) else self.checked_ids(prompt)

    async def encode(self, text: str, param: str) -> list[int]:
        """Token ids of a text prompt, tokenized off the event loop; text too long to fit is refused unread."""
        if len(text) > self.longest_prompt_chars:
            raise RequestValidationError(f"{param} of {len(text)} characters cannot fit the context of "
                                         f"{self.context_len} tokens", param)
        return await asyncio.to_thread(self.tokenizer.encode, text)

    def checked_ids(self, ids: list[int]) -> list[int]:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestValidationError(f"prompt token ids must be in [0, {self.vocab_size}), got {bad[0]}", "prompt")
        return ids

    def sampling_params(self, req, extra_stop=()) -> SamplingParams:
        """The request's sampling fields over the server's defaults; a config error names the request's field."""
        try:
            params = req.sampling_params(self.defaults, list(extra_stop))
            params.check_vocabulary(self.vocab_size)
        except ConfigError as e:
            message = str(e)
            named = re.match(r"sampling\.(\w+)", message)
            raise RequestValidationError(message.replace("sampling.", "", 1), named and named.group(1)) from None
        return params

    def fit_to_context(self, req, ids: list[int], params: SamplingParams) -> None:
        """Refuses a prompt the context cannot hold with room for max_tokens; without max_tokens, the output
        is capped at the room left."""
        context_len = self.context_len
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


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The body, refused (413) past `max_body_bytes`: by its declared length before a byte is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body_bytes:
        raise too_large(int(declared), max_body_bytes)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > max_body_bytes:
            raise too_large(len(body), max_body_bytes)
    return bytes(body)


def too_large(size: int, max_body_bytes: int) -> RequestValidationError:
    return RequestValidationError(f"request body of {size} bytes exceeds server.max_body_bytes = {max_body_bytes}",
                                  None, status=413, code="request_too_large")
