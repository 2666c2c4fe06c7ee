"""OpenAI API request models (validated before anything reaches the engine) and response bodies.

Types are strict (a string where a number belongs is refused, not coerced); fields the engine does
not implement are refused when set to anything but their neutral value; unknown fields are ignored,
as OpenAI-compatible servers do. Unset sampling fields take the server's `sampling` config.
"""

import time
import uuid
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from engine.sampling_params import SamplingParams

MAX_SEED = 2**64 - 1
Number = Union[StrictInt, StrictFloat]


class RequestValidationError(ValueError):
    """A request the server refuses with a 4xx: `param` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: StrictStr
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[Number, Field(ge=0)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None  # an extra field, as in vLLM; 0 or -1: off
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    ignore_eos: StrictBool = False
    presence_penalty: Number = 0
    frequency_penalty: Number = 0
    logit_bias: dict | None = None
    user: StrictStr | None = None

    def check_supported(self) -> None:
        if self.n != 1:
            raise RequestValidationError(f"n must be 1 (one completion per request), got {self.n}", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise RequestValidationError(f"{name} is not supported: leave it at 0", name)
        if self.logit_bias:
            raise RequestValidationError("logit_bias is not supported", "logit_bias")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if any(s == "" for s in stops):
            raise RequestValidationError("stop strings must not be empty", "stop")

    def sampling_params(self, defaults: SamplingParams, extra_stop: list[str] = ()) -> SamplingParams:
        """Unset fields fall back to the server's `sampling` config."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or defaults.stop)
        top_k = defaults.top_k if self.top_k is None else max(self.top_k, 0)
        return SamplingParams(
            max_new_tokens=self.max_tokens or defaults.max_new_tokens,
            temperature=float(defaults.temperature if self.temperature is None else self.temperature),
            top_p=float(defaults.top_p if self.top_p is None else self.top_p),
            top_k=top_k, seed=self.seed if self.seed is not None else defaults.seed,
            stop=stop + [s for s in extra_stop if s not in stop], ignore_eos=self.ignore_eos or defaults.ignore_eos,
        )


class CompletionRequest(SamplingFields):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise RequestValidationError("echo is not supported", "echo")
        if self.logprobs is not None:
            raise RequestValidationError("logprobs is not supported", "logprobs")
        if self.best_of not in (None, 1):
            raise RequestValidationError(f"best_of must be 1, got {self.best_of}", "best_of")
        if self.suffix:
            raise RequestValidationError("suffix is not supported", "suffix")

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
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    tools: list | None = None
    response_format: dict | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs:
            raise RequestValidationError("logprobs is not supported", "logprobs")
        if self.tools:
            raise RequestValidationError("tools are not supported", "tools")
        if self.response_format and self.response_format.get("type") != "text":
            raise RequestValidationError("response_format must be {'type': 'text'}", "response_format")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens

    def conversation(self) -> list[tuple[str, str]]:
        return [("system" if m.role == "developer" else m.role, m.text()) for m in self.messages]


def error_body(message: str, param: str | None = None, err_type: str = "invalid_request_error",
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, finish_reason: str | None, chunk: bool,
                    use: dict | None = None) -> dict:
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if use is not None or not chunk:
        body["usage"] = use
    return body


def chat_body(rid: str, model: str, text: str, finish_reason: str) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish_reason}]}


def chat_chunk(rid: str, model: str, delta: dict, finish_reason: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
