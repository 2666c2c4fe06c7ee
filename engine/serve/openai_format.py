"""The OpenAI bodies of one response: the choices with their logprobs and usage, whole or as the chunks
of a stream, and each chunk as a server-sent event's data line.

A choice's logprobs cover the tokens its text shows, so a stop token, or one past a stop string, has
none. The usage chunk of a stream carries no choice, as OpenAI sends it.
"""

import json

from eyas.engine.outputs import RequestOutput
from eyas.engine.serve.protocol import (
    chat_body,
    chat_choice,
    chat_chunk,
    chat_logprobs,
    completion_body,
    completion_choice,
    completion_logprobs,
    usage,
)
from eyas.engine.tokenizer import Tokenizer


def sse_data(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def include_usage(req) -> bool:
    """Whether a stream ends with a usage chunk (`stream_options.include_usage`)."""
    return bool(req.stream_options and req.stream_options.include_usage)


def request_usage(ids: list[int], outputs: list[RequestOutput]) -> dict:
    """The usage of a request's samples: one prompt, every sample's tokens, the prompt tokens cached."""
    cached = max((o.stats.get("cached_tokens", 0) for o in outputs), default=0)
    return usage(len(ids), sum(len(o.token_ids) for o in outputs), cached)


def text_logprobs(output: RequestOutput, tokenizer: Tokenizer) -> list:
    """The logprobs of the tokens the text shows: a stop token's or one past a stop string's are cut."""
    entries = output.logprobs or []
    if output.finish_reason == "stop" and entries and tokenizer.decode(output.token_ids) != output.text:
        shown = len(output.token_ids)
        while shown > 0 and len(tokenizer.decode(output.token_ids[:shown - 1])) >= len(output.text):
            shown -= 1
        entries = entries[:shown]
    return entries


class CompletionFormat:
    """The bodies of one /v1/completions response (`rid`) to `req`, whose prompt is `ids`."""

    def __init__(self, rid: str, model_name: str, tokenizer: Tokenizer, req, ids: list[int]):
        self.rid, self.model_name, self.tokenizer, self.req, self.ids = rid, model_name, tokenizer, req, ids

    def logprobs(self, entries: list, offset: int) -> dict | None:
        return None if self.req.logprobs is None else completion_logprobs(entries, self.tokenizer.token_text, offset)

    def chunk(self, index: int, text: str, finish_reason: str | None, entries: list, offset: int) -> dict:
        choice = completion_choice(index, text, finish_reason, self.logprobs(entries, offset))
        return completion_body(self.rid, self.model_name, [choice], chunk=True)

    def usage_chunks(self, outputs: list[RequestOutput]) -> list[dict]:
        return [completion_body(self.rid, self.model_name, [], chunk=True, use=request_usage(self.ids, outputs))]

    def body(self, outputs: list[RequestOutput]) -> dict:
        choices = [completion_choice(i, o.text, o.finish_reason, self.logprobs(text_logprobs(o, self.tokenizer), 0))
                   for i, o in enumerate(outputs)]
        return completion_body(self.rid, self.model_name, choices, chunk=False, use=request_usage(self.ids, outputs))


class ChatCompletionFormat:
    """The bodies of one /v1/chat/completions response (`rid`) to `req`, whose prompt is `ids`."""

    def __init__(self, rid: str, model_name: str, tokenizer: Tokenizer, req, ids: list[int]):
        self.rid, self.model_name, self.tokenizer, self.req, self.ids = rid, model_name, tokenizer, req, ids

    def logprobs(self, entries: list) -> dict | None:
        return chat_logprobs(entries, self.tokenizer.token_text) if self.req.logprobs else None

    def first_chunks(self) -> list[dict]:
        """The assistant's role, one chunk per sample, before any token."""
        return [chat_chunk(self.rid, self.model_name, i, {"role": "assistant", "content": ""}, None)
                for i in range(self.req.n)]

    def chunk(self, index: int, text: str, finish_reason: str | None, entries: list, offset: int) -> dict:
        delta = {"content": text} if text or finish_reason is None else {}
        return chat_chunk(self.rid, self.model_name, index, delta, finish_reason, self.logprobs(entries))

    def usage_chunks(self, outputs: list[RequestOutput]) -> list[dict]:
        body = chat_chunk(self.rid, self.model_name, 0, {}, None)
        body["choices"], body["usage"] = [], request_usage(self.ids, outputs)
        return [body]

    def body(self, outputs: list[RequestOutput]) -> dict:
        body = chat_body(self.rid, self.model_name, [chat_choice(i, o.text, o.finish_reason,
                                                                 self.logprobs(text_logprobs(o, self.tokenizer)))
                                                     for i, o in enumerate(outputs)])
        body["usage"] = request_usage(self.ids, outputs)
        return body
