from dataclasses import dataclass, field

from engine.errors import ConfigError
from engine.keyed_random import MAX_SEED


@dataclass
class SamplingParams:
    """Per-request generation settings.

    temperature 0 means greedy. top_k <= 0 and top_p == 1 disable those filters. A sampled request's
    token at output position i is drawn with noise keyed by (`seed`, i), so with a seed it does not
    depend on the rest of the batch, the speculative configuration or the step schedule; without
    one, the engine draws a seed from its own `seed`.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, prefix: str = "sampling") -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"{prefix}.max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ConfigError(f"{prefix}.temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"{prefix}.top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"{prefix}.top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ConfigError(f"{prefix}.seed must be an integer in [0, 2**64) or null, got {self.seed!r}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ConfigError(f"{prefix}.stop must be a list of non-empty strings, got {self.stop!r}")
