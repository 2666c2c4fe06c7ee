"""Aggregate engine figures, returned by `Engine.metrics()` as a plain dict."""

from dataclasses import asdict, dataclass


@dataclass
class EngineMetrics:
    num_requests: int = 0
    num_finished: int = 0
    num_failed: int = 0
    num_aborted: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    forward_steps: int = 0
    generate_time_s: float = 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["tokens_per_s"] = self.generated_tokens / self.generate_time_s if self.generate_time_s > 0 else 0.0
        return out
