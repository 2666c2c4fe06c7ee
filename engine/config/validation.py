"""Checks of the resolved config (a plain dict; see `eyas.engine.config.resolution`), changing nothing. Each
error names the field and what is allowed."""

import math

from eyas.engine.chat_template import ChatTemplate
from eyas.engine.errors import ConfigError
from eyas.engine.graphs.settings import validate_graphs
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.speculative.candidate import Candidate, parse_candidate
from eyas.engine.speculative.drafters.registry import CANDIDATE_DRAFTERS, HOSTS, draft_kinds, grafts_lookup, lookups_of
from eyas.engine.speculative.tree import max_tree_nodes

# speculative.suffix_max_tokens: bounds of the suffix index's memory (bytes per token measured on CPython
# 3.11 with the default key lengths: ~210 on code, ~715 on random ids of a 32k vocabulary)
MIN_SUFFIX_TOKENS, MAX_SUFFIX_TOKENS, SUFFIX_BYTES_PER_TOKEN = 1024, 1 << 24, "250-750"
MAX_NGRAM_MATCH = 32  # speculative.ngram_max_match: key lengths the lookups index every token at
MAX_SUFFIX_MATCH = 4096  # speculative.suffix_max_match
MAX_SPEC_FACTOR = 64.0  # speculative.suffix_max_spec_factor

# metrics a run can return to a sweeper -> whether only speculative runs have it
OBJECTIVES = {"tokens_per_s": False, "generated_tokens": False, "generate_time_s": False, "forward_steps": False,
              "mean_accept_length": True, "draft_accept_rate": True}


def _positive(config: dict, group: str, key: str, minimum: int = 1) -> None:
    value = config[group][key]
    if not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{group}.{key} must be an integer >= {minimum}, got {value!r}")


def validate(config: dict) -> None:
    """Raises ConfigError naming the first field that is not allowed."""
    cache = config["cache"]
    for key in ("page_size", "max_total_tokens", "max_running_requests", "max_prefill_tokens"):
        _positive(config, "cache", key)
    if cache["max_total_tokens"] < cache["page_size"]:
        raise ConfigError(
            f"cache.max_total_tokens ({cache['max_total_tokens']}) must be at least cache.page_size ({cache['page_size']})"
        )
    if cache["max_context_len"] is not None:
        _positive(config, "cache", "max_context_len", minimum=2)
    if not isinstance(cache["prefix_caching"], bool):
        raise ConfigError(f"cache.prefix_caching must be true or false, got {cache['prefix_caching']!r}")

    SamplingParams(**config["sampling"]).validate("sampling")
    validate_graphs(config["graphs"])
    _validate_attention(config)
    threads = config["num_threads"]
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"num_threads must be an integer >= 1, or null for one thread per core; got {threads!r}")

    spec = config["speculative"]
    kinds = draft_kinds(spec["algorithm"])
    if config["draft"]["kind"] not in kinds:
        raise ConfigError(
            f"speculative.algorithm={spec['algorithm']!r} needs draft.kind in {list(kinds)}, got "
            f"draft.kind={config['draft']['kind']!r}; set draft={spec['algorithm']} or leave the draft group unset"
        )
    _validate_adaptive(config)  # before the speculative shape: resolving may have taken it from the first tier
    _positive(config, "speculative", "num_steps", minimum=0)
    _positive(config, "speculative", "topk", minimum=1)
    _positive(config, "speculative", "num_draft_tokens", minimum=1)
    if spec["algorithm"] == "none" and spec["num_steps"] != 0:
        raise ConfigError(
            f"speculative.num_steps must be 0 when speculative.algorithm is 'none', got {spec['num_steps']}; "
            "choose a speculative algorithm to draft tokens"
        )
    lookups = lookups_in_use(spec, config["adaptive"])
    if lookups:  # every lookup keys on the n-gram lengths
        _validate_ngram(spec)
    if "suffix" in lookups:
        _validate_suffix(spec)
    if spec["topk"] > 1:
        _validate_tree(config)
    elif spec["num_draft_tokens"] != spec["num_steps"] + 1:
        raise ConfigError(
            f"speculative.num_draft_tokens must equal speculative.num_steps + 1 = {spec['num_steps'] + 1} "
            f"when speculative.topk is 1, got {spec['num_draft_tokens']}"
        )
    if config["draft"]["kind"] != "none" and not config["draft"]["path"]:
        kind = config["draft"]["kind"]
        heads = config["model"].get("heads") or {}
        trained = [k for k, v in heads.items() if v]
        raise ConfigError(f"draft.path is required for draft.kind={kind!r}: no such draft is trained for "
                          f"model.path={config['model']['path']} (model.heads has {trained or 'none'}); set "
                          f"draft.path to a head directory, or a speculative algorithm whose head the model has "
                          f"or that needs none (ngram, suffix, none)")

    if config.get("prompt") is not None and config.get("prompts_file") is not None:
        raise ConfigError("set at most one of `prompt` and `prompts_file` (prompts_file alone replaces the default prompt)")
    objective = config.get("objective", "tokens_per_s")
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective {objective!r} is not a metric a run returns; allowed: {list(OBJECTIVES)}")
    if OBJECTIVES[objective] and spec["algorithm"] == "none":
        allowed = [name for name, speculative in OBJECTIVES.items() if not speculative]
        raise ConfigError(f"objective {objective!r} needs speculative decoding, but speculative.algorithm is 'none'; "
                          f"allowed without it: {allowed}")
    if not isinstance(config["seed"], int) or config["seed"] < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {config['seed']!r}")
    if config.get("server") is not None:
        _validate_server(config["server"])
    if config.get("replicas") is not None:
        _validate_replicas(config["replicas"])


def _validate_ngram(spec: dict) -> None:
    low, high, trust = spec["ngram_min_match"], spec["ngram_max_match"], spec["ngram_trust"]
    if not isinstance(low, int) or low < 1:
        raise ConfigError(f"speculative.ngram_min_match must be an integer >= 1, got {low!r}")
    if not isinstance(high, int) or not low <= high <= MAX_NGRAM_MATCH:
        raise ConfigError(f"speculative.ngram_max_match must be an integer in speculative.ngram_min_match ({low}).."
                          f"{MAX_NGRAM_MATCH} (each token is indexed once per length), got {high!r}")
    if not isinstance(trust, int) or trust < 1:
        raise ConfigError(f"speculative.ngram_trust must be an integer >= 1 (a match length; above "
                          f"ngram_max_match={high}: the head always runs), got {trust!r}")


def _other_drafters(adaptive: dict) -> set[str]:
    """The other drafters the adaptive tiers list (none with adaptive off)."""
    if adaptive["policy"] == "off":
        return set()
    return {parse_candidate(c).drafter for tier in adaptive["tiers"] for c in tier["candidates"]} - {None}


def lookups_in_use(spec: dict, adaptive: dict) -> set[str]:
    """The lookups that draft (`registry.LOOKUPS`): the configured drafter's, an adaptive candidate's, or
    the lookup of a hybrid rule that runs."""
    drafters = {spec["algorithm"]} | _other_drafters(adaptive)
    return set().union(*(lookups_of(drafter, spec) for drafter in drafters))


def _validate_suffix(spec: dict) -> None:
    longest, factor = spec["suffix_max_match"], spec["suffix_max_spec_factor"]
    prob, room = spec["suffix_min_token_prob"], spec["suffix_max_tokens"]
    if (not isinstance(longest, int) or isinstance(longest, bool)
            or not spec["ngram_max_match"] <= longest <= MAX_SUFFIX_MATCH):
        raise ConfigError(f"speculative.suffix_max_match must be an integer in speculative.ngram_max_match "
                          f"({spec['ngram_max_match']})..{MAX_SUFFIX_MATCH}, got {longest!r}")
    if (not isinstance(factor, (int, float)) or isinstance(factor, bool) or not math.isfinite(factor)
            or not 0 < factor <= MAX_SPEC_FACTOR):
        raise ConfigError(f"speculative.suffix_max_spec_factor must be a number in (0, {MAX_SPEC_FACTOR}] (drafts "
                          f"per matched token), got {factor!r}")
    if not isinstance(prob, (int, float)) or isinstance(prob, bool) or not 0.0 <= prob <= 1.0:
        raise ConfigError(f"speculative.suffix_min_token_prob must be in [0, 1], got {prob!r}")
    if not isinstance(room, int) or isinstance(room, bool) or not MIN_SUFFIX_TOKENS <= room <= MAX_SUFFIX_TOKENS:
        raise ConfigError(f"speculative.suffix_max_tokens must be an integer in {MIN_SUFFIX_TOKENS}..{MAX_SUFFIX_TOKENS} "
                          f"(tokens kept over every request's stream, about {SUFFIX_BYTES_PER_TOKEN} bytes each), "
                          f"got {room!r}")


def _validate_tree(config: dict) -> None:
    spec = config["speculative"]
    topk, steps, nodes = spec["topk"], spec["num_steps"], spec["num_draft_tokens"]
    if spec["algorithm"] == "none":
        raise ConfigError(f"speculative.topk={topk} drafts trees, which needs speculative decoding, but "
                          "speculative.algorithm is 'none'; set speculative=eagle3 (or eagle), or topk=1")
    if steps < 1:
        raise ConfigError(f"speculative.num_steps must be >= 1 with speculative.topk={topk} (a tree), got {steps}")
    temperature = spec["tree_score_temperature"]
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        raise ConfigError(f"speculative.tree_score_temperature must be > 0 (1 = EAGLE-2's scores), got {temperature!r}")
    most, branches = _tree_node_range(spec["algorithm"], topk, steps)
    if not 2 <= nodes <= most:
        raise ConfigError(f"speculative.num_draft_tokens must be in 2..{most} with topk={topk} and num_steps={steps} "
                          f"(the root plus at most topk + (num_steps - 1) * topk^2 proposed nodes{branches}), "
                          f"got {nodes}")


def _tree_node_range(algorithm: str, topk: int, steps: int) -> tuple[int, str]:
    """The most nodes a tree of `steps` expansion steps of `topk` children holds, and what the hybrid adds."""
    if grafts_lookup(algorithm):  # the lookup's branches: topk continuations of num_steps tokens
        return max_tree_nodes(topk, steps) + topk * steps, " + topk * num_steps n-gram nodes"
    return max_tree_nodes(topk, steps), ""


TREE_KEYS = ("num_steps", "topk", "num_draft_tokens")
CANDIDATE_FORMS = ("a step count >= 0, a tree shape {num_steps: S, topk: K, num_draft_tokens: N}, or another "
                   "drafter {drafter: D, num_steps: S} (a chain) or {drafter: D, num_steps: S, topk: K, "
                   "num_draft_tokens: N} (a tree)")


def _tree_candidate(algorithm: str, where: str, value, drafter: str | None = None) -> Candidate:
    """A tier's tree candidate {num_steps, topk, num_draft_tokens}, checked like speculative.* for a tree."""
    if not isinstance(value, dict) or sorted(value) != sorted(TREE_KEYS):
        raise ConfigError(f"{where} must be {CANDIDATE_FORMS}, got {value!r}")
    steps, topk, nodes = (value[key] for key in TREE_KEYS)
    if not all(isinstance(v, int) for v in (steps, topk, nodes)) or steps < 1 or topk < 2:
        raise ConfigError(f"{where}: a tree shape needs integers num_steps >= 1 and topk >= 2 "
                          f"(topk 1 is the chain: list its step count), got {value!r}")
    most, branches = _tree_node_range(algorithm, topk, steps)
    if not 2 <= nodes <= most:
        raise ConfigError(f"{where}.num_draft_tokens must be in 2..{most} with topk={topk} and num_steps={steps} "
                          f"(the root plus at most topk + (num_steps - 1) * topk^2 proposed nodes{branches}), "
                          f"got {nodes}")
    return Candidate(steps, topk, nodes, drafter)


def _other_candidate(algorithm: str, where: str, value: dict) -> Candidate:
    """A tree shape, or another drafter at a chain length or tree shape of its own."""
    if "drafter" not in value:
        return _tree_candidate(algorithm, where, value)
    drafter, shape = value["drafter"], {key: v for key, v in value.items() if key != "drafter"}
    allowed = [d for d in CANDIDATE_DRAFTERS if d != algorithm]
    if algorithm not in HOSTS:
        raise ConfigError(f"{where}: other drafters need the draft head they share state with: "
                          f"speculative.algorithm in {list(HOSTS)}, got {algorithm!r}")
    if drafter not in allowed:
        raise ConfigError(f"{where}.drafter must be one of {allowed} (the configured {algorithm!r} drafter's "
                          f"candidates are listed without `drafter`), got {drafter!r}")
    if sorted(shape) == ["num_steps"]:
        steps = shape["num_steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ConfigError(f"{where}.num_steps must be an integer >= 1 (the longest chain the {drafter} "
                              f"drafter proposes), got {steps!r}")
        return Candidate(steps, drafter=drafter)
    return _tree_candidate(drafter, where, shape, drafter)


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _validate_attention(config: dict) -> None:
    """Batch-invariant attention and exact logprobs attend one query per call: torch_native's way (graphs
    keep it only where they attend one query at a time: checked when the target is built)."""
    attention = config["attention"]
    for key in ("batch_invariant", "exact_logprobs"):
        if attention[key] not in (None, True, False):
            raise ConfigError(f"attention.{key} must be true, false or null, got {attention[key]!r}")
        if attention[key] and attention["backend"] != "torch_native":
            raise ConfigError(f"attention.{key}=true needs attention.backend=torch_native, got {attention['backend']!r}")


def _validate_server(server: dict) -> None:
    port = server["port"]
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"server.port must be an integer in 1..65535, got {port!r}")
    if not isinstance(server["max_queue"], int) or server["max_queue"] < 1:
        raise ConfigError(f"server.max_queue must be an integer >= 1, got {server['max_queue']!r}")
    if not isinstance(server["max_body_bytes"], int) or server["max_body_bytes"] < 1024:
        raise ConfigError(f"server.max_body_bytes must be an integer >= 1024, got {server['max_body_bytes']!r}")
    if server["log_level"] not in LOG_LEVELS:
        raise ConfigError(f"server.log_level must be one of {list(LOG_LEVELS)}, got {server['log_level']!r}")
    for key in ("served_model_name", "api_key"):
        if server[key] is not None and not str(server[key]).strip():
            raise ConfigError(f"server.{key} must be a non-empty string or null, got {server[key]!r}")
    if not str(server["host"]).strip():
        raise ConfigError("server.host must be an address to listen on, e.g. 127.0.0.1 or 0.0.0.0")
    ChatTemplate(**server["chat_template"])  # checks its formats


def _validate_adaptive(config: dict) -> None:
    adaptive, spec = config["adaptive"], config["speculative"]
    policy = adaptive["policy"]
    if policy == "off":
        return
    if policy not in ("ema", "throughput"):
        raise ConfigError(f"adaptive.policy must be 'off', 'ema' or 'throughput' (resolving turns 'auto' into one "
                          f"of them), got {policy!r}")
    if spec["algorithm"] == "none":
        raise ConfigError(f"adaptive.policy={policy!r} needs speculative decoding, but speculative.algorithm is 'none'; "
                          "set speculative=eagle3 (or eagle), or adaptive=off")
    alpha = adaptive["ema_alpha"]
    if not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
        raise ConfigError(f"adaptive.ema_alpha must be in (0, 1], got {alpha!r}")
    _positive(config, "adaptive", "update_interval")
    _positive(config, "adaptive", "warmup_batches", minimum=0)
    _positive(config, "adaptive", "probe_interval", minimum=0)
    tiers = adaptive["tiers"]
    if not tiers:
        raise ConfigError("adaptive.tiers must list at least one tier ({batch_size: N, candidates: [...]})")
    previous = 0
    for i, tier in enumerate(tiers):
        size, candidates = tier["batch_size"], tier["candidates"]
        if not isinstance(size, int) or size <= previous:
            raise ConfigError(f"adaptive.tiers[{i}].batch_size must be an integer greater than the previous tier's "
                              f"({previous}): tiers are sorted by batch size, got {size!r}")
        previous = size
        _validate_candidates(spec["algorithm"], policy, i, candidates)


def _validate_candidates(algorithm: str, policy: str, i: int, candidates: list) -> None:
    """Step counts >= 0 sorted ascending without repeats, then distinct tree shapes and other drafters
    (throughput policy only)."""
    where = f"adaptive.tiers[{i}].candidates"
    if not candidates:
        raise ConfigError(f"{where} must be a non-empty list of step counts >= 0 (then tree shapes and other "
                          f"drafters), got {candidates!r}")
    chains = [c for c in candidates if not isinstance(c, dict)]
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in chains):
        raise ConfigError(f"{where} must hold {CANDIDATE_FORMS}; got {candidates!r}")
    if candidates[:len(chains)] != chains or chains != sorted(set(chains)):
        raise ConfigError(f"{where} must list step counts ascending without repeats, then tree shapes and other "
                          f"drafters; got {candidates!r}")
    others = [_other_candidate(algorithm, f"{where}[{j}]", c) for j, c in enumerate(candidates) if isinstance(c, dict)]
    if len(set(others)) != len(others):
        raise ConfigError(f"{where} lists a candidate twice: {[str(c) for c in others]}")
    if others and policy != "throughput":
        raise ConfigError(f"{where}: tree shapes and other drafters need adaptive.policy=throughput (the {policy!r} "
                          f"policy walks step counts only), got {[str(c) for c in others]}")


def _validate_replicas(replicas: dict) -> None:
    def positive_int(key: str, value, least: int = 1) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigError(f"replicas.{key} must be an integer >= {least}, got {value!r}")

    positive_int("num_replicas", replicas["num_replicas"])
    positive_int("max_ongoing_requests", replicas["max_ongoing_requests"])
    positive_int("retries", replicas["retries"], least=0)
    for key in ("cpus_per_replica", "first_part_timeout_s"):
        if not isinstance(replicas[key], (int, float)) or replicas[key] <= 0:
            raise ConfigError(f"replicas.{key} must be a number > 0, got {replicas[key]!r}")
    if replicas["address"] is not None and not str(replicas["address"]).strip():
        raise ConfigError("replicas.address must be null (a local Ray cluster) or a Ray cluster's address, e.g. "
                          "auto or ray://head:10001")
    prefix = replicas["prefix"]
    if not isinstance(prefix["min_match_ratio"], (int, float)) or not 0 <= prefix["min_match_ratio"] <= 1:
        raise ConfigError(f"replicas.prefix.min_match_ratio must be a number in [0, 1], got {prefix['min_match_ratio']!r}")
    positive_int("prefix.max_imbalance", prefix["max_imbalance"], least=0)
    if not isinstance(prefix["max_load_ratio"], (int, float)) or isinstance(prefix["max_load_ratio"], bool) \
            or prefix["max_load_ratio"] < 1:
        raise ConfigError(f"replicas.prefix.max_load_ratio must be a number >= 1, got {prefix['max_load_ratio']!r}")
    positive_int("prefix.chunk_chars", prefix["chunk_chars"], least=8)
    positive_int("prefix.max_chunks", prefix["max_chunks"])
