"""Small construction helpers the containers call: pure functions from config values to objects."""

import dataclasses
from pathlib import Path

import torch

from eyas.engine.cache.kv_pool import PagedKVPool
from eyas.engine.cache.prefix_cache import PrefixCache
from eyas.engine.config.schema import AdaptiveConfig, GraphsConfig, SpeculativeConfig
from eyas.engine.config.validation import lookups_in_use
from eyas.engine.errors import ConfigError
from eyas.engine.graphs.graph_attention import attends_per_query
from eyas.engine.graphs.graph_runner import GraphRunner
from eyas.engine.graphs.settings import GraphSettings, graph_settings
from eyas.engine.models.checkpoint_source import gguf_source
from eyas.engine.models.weight_formats import resolve_quantization
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.speculative.candidate import Candidate, parse_candidate, sorted_candidates
from eyas.engine.speculative.drafters.registry import HOST, PLAIN, needs_draft_model
from eyas.engine.tokenizer import Tokenizer


def resolve_device(name: str, num_threads: int | None = None) -> torch.device:
    """The device `name` names, with torch's CPU thread count set to `num_threads` (None: torch's default)."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available; allowed here: auto, cpu")
    return torch.device(name)


def load_tokenizer(path: str) -> Tokenizer | None:
    """The checkpoint's tokenizer, or None when it ships none (token-id prompts still work)."""
    if not (Path(path).expanduser() / "tokenizer.json").is_file():
        return None
    return Tokenizer.from_dir(Path(path).expanduser())


def vocab_size(model) -> int:
    return model.config.vocab_size


def tokenizer_json(tokenizer: Tokenizer | None) -> str | None:
    return None if tokenizer is None else tokenizer.to_json()


def eos_token_ids(model, tokenizer: Tokenizer | None) -> tuple[int, ...]:
    if model.config.eos_token_ids:
        return model.config.eos_token_ids
    return tokenizer.eos_token_ids if tokenizer is not None else ()


def max_context_len(configured: int | None, model) -> int:
    """The longest sequence the engine serves. Every layer attends over the whole sequence, which is
    exact for a sliding-window model only while sequences fit in its window: by default the context
    stops there, and a longer one set by hand is refused."""
    config = model.config
    window = config.sliding_window
    if configured is None:
        return config.max_position_embeddings if window is None else min(window, config.max_position_embeddings)
    if window is not None and configured > window:
        raise ConfigError(
            f"cache.max_context_len = {configured} exceeds the model's sliding_window ({window} in config.json of "
            f"{config.architecture}): eyas attends over the whole sequence, which equals sliding-window attention "
            f"only within the window; allowed: 2..{window}, or null for {min(window, config.max_position_embeddings)}"
        )
    return configured


def prefix_cache(enabled: bool, allocator, page_size: int) -> PrefixCache | None:
    return PrefixCache(allocator, page_size) if enabled else None


def num_pages(max_total_tokens: int, page_size: int) -> int:
    return max_total_tokens // page_size


def kv_pool_for(model, num_pages: int, page_size: int, device: torch.device) -> PagedKVPool:
    cfg = model.config
    dtype = model.model.embed_tokens.weight.dtype
    return PagedKVPool(cfg.num_hidden_layers, num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim, dtype, device)


def head_dim_of(model) -> int:
    return model.config.head_dim


def sampling_params(sampling) -> SamplingParams:
    """The `sampling` group's defaults (its fields are SamplingParams')."""
    return SamplingParams(**vars(sampling))


def lookahead_tokens(algorithm: str, shapes: list[Candidate]) -> int:
    """KV positions a speculative step may write past the committed length, over every shape the worker
    may run: the verify chain, or a tree's nodes and the draft forwards' frontier nodes."""
    if algorithm == "none":
        return 0
    # a standalone LM's draft nodes sit one column past an EAGLE head's (after the root's)
    return max(s.num_steps + 1 if s.is_chain else max(s.num_steps + 1, s.num_draft_tokens, (s.num_steps - 1) * s.topk + 1)
               for s in shapes)


def speculative_shapes(spec: SpeculativeConfig, adaptive: AdaptiveConfig) -> list[Candidate]:
    """The configured candidate and, with adaptive speculation, every tier's."""
    shapes = [configured_candidate(spec)]
    if adaptive.policy != "off":
        shapes += adaptive_candidates(adaptive)
    return shapes


def configured_candidate(spec: SpeculativeConfig) -> Candidate:
    return Candidate(spec.num_steps, spec.topk, spec.num_draft_tokens)


def lookups(spec: SpeculativeConfig, adaptive: AdaptiveConfig) -> set[str]:
    """The lookups some candidate or rule drafts with, by the rule validation checks them by."""
    return lookups_in_use(dataclasses.asdict(spec), dataclasses.asdict(adaptive))


def adaptive_tiers(adaptive: AdaptiveConfig) -> list[tuple[int, list]]:
    """The tiers as `(batch_size, candidates)` pairs (`tiers.build_tiers`)."""
    return [(tier.batch_size, tier.candidates) for tier in adaptive.tiers]


def max_topk(spec: SpeculativeConfig, adaptive: AdaptiveConfig) -> int:
    """The most children per node of any shape the worker may run."""
    return max(shape.topk for shape in speculative_shapes(spec, adaptive))


def adaptive_candidates(adaptive: AdaptiveConfig) -> list[Candidate]:
    """Every tier's candidates, ordered by `Candidate.sort_key`."""
    return sorted_candidates(parse_candidate(c) for tier in adaptive.tiers for c in tier.candidates)


def drafter_name(algorithm: str, adaptive: AdaptiveConfig) -> str:
    """The drafter to build: the one `algorithm` names, or the host (`registry.HOST`, which drafts as the
    head alone, as each lookup alone, or as its own rule) when adaptive tiers list other drafters."""
    others = adaptive.policy != "off" and any(c.drafter is not None for c in adaptive_candidates(adaptive))
    return HOST if others else algorithm


def drafter_of(parts, name: str):
    """Drafter `name`, built from `parts` (`registry.DrafterParts`)."""
    return parts.drafter(name)


def draft_backends_of(algorithm: str, candidate: Candidate) -> str:
    """Whether a runtime state gets draft-head backends: not for a drafter without a draft model."""
    return "head" if needs_draft_model(candidate.drafter or algorithm) else "none"


def worker_kind(algorithm: str) -> str:
    """plain decoding, or speculative decoding by a drafter."""
    return "plain" if algorithm == PLAIN else "speculative"


def capture_layers_of(draft, target) -> tuple[int, ...]:
    """The target layers whose input the draft head reads as features."""
    return draft.target_aux_layer_ids(target.config.num_hidden_layers)


def enable_adaptive(worker, states: dict, controller):
    return worker.enable_adaptive(states, controller)


def decay_of(ema_alpha: float) -> float:
    return 1.0 - ema_alpha


def backend_or_default(name: str | None, default: str) -> str:
    return name or default


def attention_backend(backend_classes: dict[str, type], name: str, head_dim: int, batch_invariant: bool = False):
    """A fresh backend of the registered class `name` (backends hold per-batch metadata)."""
    return backend_classes[name](head_dim, batch_invariant=True) if batch_invariant else backend_classes[name](head_dim)


def model_quantization(scheme: str, checkpoint: Path, device: torch.device) -> str:
    """`model.quantization` as the target runs it (`auto`: gguf for a GGUF file on a CPU, else none)."""
    return resolve_quantization(scheme, gguf_source(checkpoint) is not None, device)


def batch_invariant_attention(setting: bool | None, backend: str, quantization: str, graph_mode: str,
                              dtype: torch.dtype = torch.float32, device: torch.device = torch.device("cpu")) -> bool:
    """`attention.batch_invariant`, resolved: null is on for a quantized or half-precision target, whose
    GEMMs are row-invariant but whose rounding of activations turns the last bit of a batched attention
    into a different token on near ties (gguf_f32's GEMM keeps float32 activations: off, as for float32).
    Graphs keep it where they attend one query at a time (`attends_per_query`: float32 on a CPU); elsewhere
    they attend batched, so null is off under graphs.mode=compile or aot, and true is refused there."""
    per_query = attends_per_query(device, dtype)
    if setting is None:
        reduced = quantization not in ("none", "gguf_f32") or dtype in (torch.bfloat16, torch.float16)
        return reduced and backend == "torch_native" and (per_query or graph_mode in ("eager", "auto"))  # auto: starts eager
    if setting and graph_mode in ("compile", "aot") and not per_query:
        raise ConfigError(f"attention.batch_invariant=true: graphs.mode={graph_mode} attends batched on a {dtype} target "
                          f"on {torch.device(device).type} (graphs attend one query at a time only in float32 on a CPU); "
                          f"set graphs.mode=eager or auto, or attention.batch_invariant=false")
    return setting


def exact_logprobs(setting: bool | None, backend: str) -> bool:
    """`attention.exact_logprobs`, resolved: null is on with the torch_native backend (the one that
    attends a query on its own)."""
    return backend == "torch_native" if setting is None else setting


def graphs_attend_per_query(model, device: torch.device) -> bool:
    """Whether graphs attend the target's pool one query at a time (`attends_per_query`)."""
    return attends_per_query(device, model_dtype_of(model))


def model_dtype_of(model) -> torch.dtype:
    return next(p for p in model.parameters() if p.is_floating_point()).dtype


def draft_kv_pool(draft, num_pages: int, page_size: int, device: torch.device) -> PagedKVPool:
    cfg = draft.config  # EAGLE heads: one layer; a standalone LM: all of its layers
    return PagedKVPool(getattr(draft, "num_kv_layers", 1), num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim, model_dtype_of(draft), device)


def graph_settings_for(graphs: GraphsConfig, device: torch.device) -> GraphSettings:
    return graph_settings(graphs.mode, graphs.batch_sizes, graphs.max_context, graphs.cache_dir, device.type)


def graph_runner(settings: GraphSettings, model, kv_pool: PagedKVPool, req_to_token: torch.Tensor, phase: str,
                 capture_layers: tuple[int, ...] = (), max_width: int | None = None,
                 chains_only: bool = False) -> GraphRunner | None:
    """A runner of `phase`'s forwards as graphs; None when graphs are off or come later, in the background
    (the phase runs eager)."""
    if not settings.enabled or settings.background:
        return None
    return GraphRunner(model, kv_pool, req_to_token, settings, phase, capture_layers, max_width, chains_only)


def background_runner(settings: GraphSettings, model, kv_pool: PagedKVPool, req_to_token: torch.Tensor, phase: str,
                      capture_layers: tuple[int, ...] = (), max_width: int | None = None,
                      chains_only: bool = False) -> GraphRunner:
    """A runner of `phase`'s forwards that loads the packages a background process compiled."""
    return GraphRunner(model, kv_pool, req_to_token, settings, phase, capture_layers, max_width, chains_only)


def warms_graphs(settings: GraphSettings, warmup: bool) -> bool:
    """Whether the engine compiles its graphs when it starts (graphs on in its own process, and `graphs.warmup`)."""
    return settings.enabled and not settings.background and warmup
