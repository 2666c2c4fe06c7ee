import math
from dataclasses import dataclass, field

from eyas.engine.errors import ConfigError
from eyas.engine.keyed_random import MAX_SEED
from eyas.engine.structured.grammars import validate_spec


@dataclass
class SamplingParams:
    """Per-request generation settings.

    temperature 0 (or below 1e-5) means greedy. top_k <= 0, top_p == 1 and min_p == 0 disable those filters. A sampled
    request's token at output position i is drawn with noise keyed by (`seed`, i), so with a seed it
    does not depend on the rest of the batch, the speculative configuration or the step schedule;
    without one, the engine draws a seed from its own `seed`.

    The target's logits at each position are processed as OpenAI and vLLM do, in this order:
    `logit_bias` (token id -> added to its logit), then `repetition_penalty` (every token of the prompt
    and the output so far: a positive logit divided by it, a negative one multiplied), then
    `frequency_penalty` x (the token's count in the output so far) and `presence_penalty` x (whether it
    occurs there) subtracted; then temperature, min_p (tokens below min_p x the best one's probability
    dropped), top-k and top-p. `logprobs` = n asks for the chosen token's log-probability and the n
    best alternatives' (0..20), from the processed logits after temperature (1 for greedy). `n`
    samples are generated per prompt; the i-th takes seed + i. `stop_token_ids` end a request like eos.
    `structured_output`: one of {"json_schema": schema}, {"json_object": True}, {"regex": pattern} or
    {"grammar": Lark grammar}; the output then follows it (masked at every position, after the
    penalties), and the request ends where it is complete.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    n: int = 1
    stop_token_ids: list[int] = field(default_factory=list)
    structured_output: dict | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logit_bias = dict(self.logit_bias or {})
        self.validate()

    @property
    def processes_logits(self) -> bool:
        """Whether the target's logits are changed before the choice (bias or a penalty)."""
        return bool(self.logit_bias) or self.penalized

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def validate(self, prefix: str = "sampling") -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"{prefix}.max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not _number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"{prefix}.temperature must be a finite number >= 0 (0 = greedy; below {GREEDY_BELOW} "
                              f"too), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"{prefix}.top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"{prefix}.top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ConfigError(f"{prefix}.seed must be an integer in [0, 2**64) or null, got {self.seed!r}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ConfigError(f"{prefix}.stop must be a list of non-empty strings, got {self.stop!r}")
        if not _number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"{prefix}.min_p must be in [0, 1] (0 = off), got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ConfigError(f"{prefix}.{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}] (0 = off), got {value!r}")
        if not _number(self.repetition_penalty) or not 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ConfigError(f"{prefix}.repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}] (1 = off), "
                              f"got {self.repetition_penalty!r}")
        for token, bias in self.logit_bias.items():
            if not _token_id(token):
                raise ConfigError(f"{prefix}.logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not _number(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ConfigError(f"{prefix}.logit_bias[{token}] must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], "
                                  f"got {bias!r}")
        if self.logprobs is not None and (not _token_id(self.logprobs) or self.logprobs > MAX_LOGPROBS):
            raise ConfigError(f"{prefix}.logprobs must be an integer in [0, {MAX_LOGPROBS}] (the alternatives "
                              f"per token) or null (none), got {self.logprobs!r}")
        if not _token_id(self.n) or not 1 <= self.n <= MAX_SAMPLES:
            raise ConfigError(f"{prefix}.n must be an integer in [1, {MAX_SAMPLES}], got {self.n!r}")
        if self.structured_output is not None:
            validate_spec(self.structured_output, f"{prefix}.structured_output")
        if not all(_token_id(t) for t in self.stop_token_ids):
            raise ConfigError(f"{prefix}.stop_token_ids must be a list of token ids (integers >= 0), "
                              f"got {self.stop_token_ids!r}")

    def check_vocabulary(self, vocab_size: int, prefix: str = "sampling") -> None:
        """Token ids the request names must exist in the model's vocabulary."""
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise ConfigError(f"{prefix}.{name}: token id {bad[0]} is not in the vocabulary [0, {vocab_size})")


GREEDY_BELOW = 1e-5  # a temperature this low samples as greedy (logits / T would overflow)
MAX_PENALTY = 2.0  # presence and frequency penalties, as OpenAI bounds them
MAX_REPETITION_PENALTY = 10.0
MAX_LOGIT_BIAS = 100.0
MAX_LOGPROBS = 20
MAX_SAMPLES = 64


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
