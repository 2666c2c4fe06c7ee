"""Cross-field checks of the composed config (a plain dict). Each error names the field and what is allowed."""

from engine.errors import ConfigError
from engine.sampling_params import SamplingParams


def _positive(config: dict, group: str, key: str, minimum: int = 1) -> None:
    value = config[group][key]
    if not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{group}.{key} must be an integer >= {minimum}, got {value!r}")


def validate_config(config: dict) -> dict:
    cache = config["cache"]
    for key in ("page_size", "max_total_tokens", "max_running_requests", "max_prefill_tokens"):
        _positive(config, "cache", key)
    if cache["max_total_tokens"] < cache["page_size"]:
        raise ConfigError(
            f"cache.max_total_tokens ({cache['max_total_tokens']}) must be at least cache.page_size ({cache['page_size']})"
        )
    if cache["max_context_len"] is not None:
        _positive(config, "cache", "max_context_len", minimum=2)

    SamplingParams(**config["sampling"]).validate("sampling")

    spec = config["speculative"]
    _positive(config, "speculative", "num_steps", minimum=0)
    _positive(config, "speculative", "topk", minimum=1)
    if spec["num_draft_tokens"] is None and spec["topk"] == 1:
        spec["num_draft_tokens"] = spec["num_steps"] + 1
    _positive(config, "speculative", "num_draft_tokens", minimum=1)
    if spec["algorithm"] == "none" and spec["num_steps"] != 0:
        raise ConfigError(
            f"speculative.num_steps must be 0 when speculative.algorithm is 'none', got {spec['num_steps']}; "
            "choose a speculative algorithm to draft tokens"
        )
    if spec["algorithm"] != "none" and config["draft"]["kind"] != spec["algorithm"]:
        raise ConfigError(
            f"speculative.algorithm={spec['algorithm']!r} needs a draft head of the same kind, but "
            f"draft.kind={config['draft']['kind']!r}; set draft={spec['algorithm']} (allowed: eagle, eagle3)"
        )
    if spec["topk"] != 1:
        raise ConfigError(f"speculative.topk must be 1 (chain drafting), got {spec['topk']}; allowed: 1")
    if spec["topk"] == 1 and spec["num_draft_tokens"] != spec["num_steps"] + 1:
        raise ConfigError(
            f"speculative.num_draft_tokens must equal speculative.num_steps + 1 = {spec['num_steps'] + 1} "
            f"when speculative.topk is 1, got {spec['num_draft_tokens']}"
        )
    if config["draft"]["kind"] != "none" and not config["draft"]["path"]:
        raise ConfigError(f"draft.path is required for draft.kind={config['draft']['kind']!r}")

    if config.get("prompt") is not None and config.get("prompts_file") is not None:
        raise ConfigError("set at most one of `prompt` and `prompts_file`")
    if not isinstance(config["seed"], int) or config["seed"] < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {config['seed']!r}")
    return config
