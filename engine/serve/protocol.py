"""OpenAI API request models (validated before anything reaches the engine) and response bodies.

Types are strict (a string where a number belongs is refused, not coerced); fields the engine does
not implement are refused when set to anything but their neutral value; unknown fields are ignored,
as OpenAI-compatible servers do. Unset sampling fields take the server's `sampling` config. A
request's `n` samples are its choices, by index.
"""

import time
import uuid
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from eyas.engine.sampling_params import (
    MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_PENALTY, MAX_REPETITION_PENALTY, MAX_SAMPLES, SamplingParams,
)

MAX_SEED = 2**64 - 1
Number = Union[StrictInt, StrictFloat]


class RequestValidationError(ValueError):
    """A request the server refuses with a 4xx: `param` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """The fields both endpoints share. top_k, min_p, repetition_penalty, stop_token_ids and ignore_eos
    are extra fields, as in vLLM; logit_bias maps token ids (as strings, as OpenAI sends them) to a bias."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
    model: StrictStr
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[Number, Field(ge=0)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None  # 0 or -1: off
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_SAMPLES)] = 1
    ignore_eos: StrictBool = False
    presence_penalty: Annotated[Number, Field(ge=-MAX_PENALTY, le=MAX_PENALTY)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-MAX_PENALTY, le=MAX_PENALTY)] | None = None
    repetition_penalty: Annotated[Number, Field(gt=0, le=MAX_REPETITION_PENALTY)] | None = None
    logit_bias: dict[StrictStr, Annotated[Number, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None = None
    response_format: dict | None = None
    guided_json: dict | StrictStr | None = None  # vLLM's structured-output fields: a JSON schema,
    guided_regex: StrictStr | None = None  # a regex,
    guided_grammar: StrictStr | None = None  # a Lark grammar
    user: StrictStr | None = None

    def check_supported(self) -> None:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if any(s == "" for s in stops):
            raise RequestValidationError("stop strings must not be empty", "stop")
        for key in self.logit_bias or {}:
            if not (key.isascii() and key.isdigit()):
                raise RequestValidationError(f"logit_bias keys must be token ids (e.g. \"13\"), got {key!r}", "logit_bias")
        self.structured_output()

    def structured_output(self) -> tuple[dict | None, str | None]:
        """(the engine's `structured_output` spec, the field that set it), or (None, None)."""
        specs = []
        if self.response_format is not None:
            kind = self.response_format.get("type")
            if kind == "json_object":
                specs.append(({"json_object": True}, "response_format"))
            elif kind == "json_schema":
                described = self.response_format.get("json_schema")
                schema = described.get("schema") if isinstance(described, dict) else None
                if not isinstance(schema, dict):
                    raise RequestValidationError("response_format.json_schema.schema must be a JSON schema object",
                                                 "response_format")
                specs.append(({"json_schema": schema}, "response_format"))
            elif kind != "text":
                raise RequestValidationError("response_format.type must be one of 'text', 'json_object', "
                                             f"'json_schema', got {kind!r}", "response_format")
        for name, kind in (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                specs.append(({kind: getattr(self, name)}, name))
        if len(specs) > 1:
            raise RequestValidationError(f"one structured output per request, got {[f for _, f in specs]}", specs[1][1])
        return specs[0] if specs else (None, None)

    def num_logprobs(self) -> int | None:
        """The alternatives per token the request asks for, or None: no logprobs."""
        return None

    def sampling_params(self, defaults: SamplingParams, extra_stop: list[str] = ()) -> SamplingParams:
        """Unset fields fall back to the server's `sampling` config; one SamplingParams for all `n` samples."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or defaults.stop)
        top_k = defaults.top_k if self.top_k is None else max(self.top_k, 0)

        def unset_default(name):
            value = getattr(self, name)
            return float(getattr(defaults, name) if value is None else value)

        bias = defaults.logit_bias if self.logit_bias is None else {int(k): float(v) for k, v in self.logit_bias.items()}
        return SamplingParams(
            max_new_tokens=self.max_tokens or defaults.max_new_tokens,
            temperature=unset_default("temperature"), top_p=unset_default("top_p"), top_k=top_k,
            min_p=unset_default("min_p"), seed=self.seed if self.seed is not None else defaults.seed,
            stop=stop + [s for s in extra_stop if s not in stop], ignore_eos=self.ignore_eos or defaults.ignore_eos,
            presence_penalty=unset_default("presence_penalty"), frequency_penalty=unset_default("frequency_penalty"),
            repetition_penalty=unset_default("repetition_penalty"), logit_bias=bias,
            stop_token_ids=defaults.stop_token_ids if self.stop_token_ids is None else list(self.stop_token_ids),
            logprobs=self.num_logprobs(), n=self.n, structured_output=self.structured_output()[0],
        )


class CompletionRequest(SamplingFields):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool = False
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise RequestValidationError("echo is not supported", "echo")
        if self.best_of not in (None, 1):
            raise RequestValidationError(f"best_of must be 1, got {self.best_of}", "best_of")
        if self.suffix:
            raise RequestValidationError("suffix is not supported", "suffix")

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text or token ids (a list holding one prompt is accepted)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise RequestValidationError(f"one prompt per request, got {len(prompt)}", "prompt")
            prompt = prompt[0]
        if len(prompt) == 0:
            raise RequestValidationError("prompt must not be empty", "prompt")
        return prompt


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestValidationError("top_logprobs needs logprobs: true", "top_logprobs")
        if self.tools:
            raise RequestValidationError("tools are not supported", "tools")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def conversation(self) -> list[tuple[str, str]]:
        return [("system" if m.role == "developer" else m.role, m.text()) for m in self.messages]


def error_body(message: str, param: str | None = None, err_type: str = "invalid_request_error",
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """cached_tokens: prompt tokens whose KV the prefix cache held (OpenAI's prompt_tokens_details)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion_body(rid: str, model: str, choices: list[dict], chunk: bool, use: dict | None = None) -> dict:
    """choices: `completion_choice`s."""
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model, "choices": choices}
    if use is not None or not chunk:
        body["usage"] = use
    return body


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_body(rid: str, model: str, choices: list[dict]) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model, "choices": choices}


def chat_choice(index: int, text: str, finish_reason: str, logprobs: dict | None = None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason}


def chat_chunk(rid: str, model: str, index: int, delta: dict, finish_reason: str | None,
               logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}


def completion_logprobs(entries: list, token_text, text_offset: int = 0) -> dict:
    """The completions API's logprobs of `entries` (TokenLogprob): each token's text, log-probability, its
    best alternatives and the chosen token (a dict, as OpenAI sends it) and where it starts in the text."""
    tokens = [token_text(e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    top = [{**{token_text(t): lp for t, lp in e.top}, token_text(e.token_id): e.logprob} for e in entries]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
            "text_offset": offsets}


def chat_logprobs(entries: list, token_text) -> dict:
    """The chat API's logprobs of `entries` (TokenLogprob): token, logprob, UTF-8 bytes, top_logprobs."""
    def item(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries]}
