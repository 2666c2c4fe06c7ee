from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """The result of one request. `token_ids` holds the generated ids only (a matched eos included);
    `text` is their decoding, cut before a matched stop string. A request that could not be served
    has `finish_reason == "error"` and the reason in `error`; the rest of its batch is unaffected.
    A prompt asked for with `n` samples has n outputs, one per sample (`index`)."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    error: str | None = None
    stats: dict = field(default_factory=dict)
    index: int = 0  # the sample's index among its prompt's `n` (OpenAI's choice index)
    logprobs: list | None = None  # a TokenLogprob per generated token, when the request asked for them
