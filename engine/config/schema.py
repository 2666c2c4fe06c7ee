"""The config's schema: one dataclass per group, what the containers receive.

Fields that choose among names are `Choice` enums whose values are read from the engine's own tables. The
Hydra config tree is composed against these classes (`eyas.launch.schema` registers them), so unknown keys
and wrong types fail at composition; cross-field rules live in `validation`. `typed_config` turns a
resolved plain config into them.
"""

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from eyas.engine.attention.registry import BACKENDS
from eyas.engine.errors import ConfigError
from eyas.engine.graphs.settings import MODES as GRAPH_MODES
from eyas.engine.models.config import DTYPES
from eyas.engine.models.fused_linear import LAYOUTS
from eyas.engine.models.weight_formats import SCHEMES
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.serve.replicas.routing import ROUTINGS
from eyas.engine.speculative.backend_factory import ATTENTION_MODES
from eyas.engine.speculative.drafters.registry import ALGORITHMS, DRAFT_MODELS, LOOKUPS, PLAIN

MISSING = "???"  # a value the config must set (OmegaConf's marker)


class Choice(str, Enum):
    """An allowed value of a field: a string everywhere it is used (printed, formatted, compared, a key)."""

    __str__ = str.__str__
    __format__ = str.__format__

    def __repr__(self) -> str:
        return repr(self.value)


class Device(Choice):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def choices(name: str, values) -> type[Enum]:
    """A string enum of `values`: the schema's allowed values of a field, read from the engine's own table."""
    return Choice(name, {value: value for value in values})


DType = choices("DType", ["auto", *DTYPES])  # auto: the checkpoint's torch_dtype (a draft's: the target's)


WeightLayout = choices("WeightLayout", ["auto", *LAYOUTS])  # engine/models/fused_linear.py


QuantizationScheme = choices("QuantizationScheme", SCHEMES)  # engine/models/weight_formats.py says what each is
AttentionBackendName = choices("AttentionBackendName", BACKENDS)  # engine/attention/registry.py


# the drafter registry's names: plain decoding and every drafter; the lookup drafters; the draft models
# (eagle, eagle3, lm: a small causal LM with the target's tokenizer)
SpeculativeAlgorithm = choices("SpeculativeAlgorithm", ALGORITHMS)
HybridLookup = choices("HybridLookup", LOOKUPS)
DraftKind = choices("DraftKind", (PLAIN, *DRAFT_MODELS))


AttentionMode = choices("AttentionMode", ATTENTION_MODES)  # engine/speculative/backend_factory.py


class DraftSampling(Choice):
    greedy = "greedy"
    sample = "sample"


class VerifyMode(Choice):
    reproducible = "reproducible"
    rejection = "rejection"


class AdaptivePolicy(Choice):
    off = "off"
    ema = "ema"
    throughput = "throughput"
    auto = "auto"  # throughput for speculative chains; off for speculative=none and for a configured tree


@dataclass
class ModelHeads:
    """The drafts trained for the target: what each speculative algorithm's draft.path defaults to."""
    eagle: Optional[str] = None
    eagle3: Optional[str] = None
    draft_lm: Optional[str] = None
    # the format EAGLE heads run in (draft.quantization of speculative eagle, eagle3, hybrid): auto is q8_0 on a
    # CPU that builds eyas's kernels (a head is read at every draft step: a quarter of float32's bytes)
    quantization: QuantizationScheme = QuantizationScheme.none


@dataclass
class ModelConfig:
    path: str = MISSING  # a Hugging Face Llama-family directory, a .gguf file, or a catalog name (smollm2)
    dtype: DType = DType.auto  # auto = the checkpoint's torch_dtype
    # fused projections stored [in, out] (transposed, x @ W), [out, in] (linear), in oneDNN's blocked layout
    # and GEMM (onednn: float32, CPU) or in blocks of 16 output columns for eyas's own small-batch GEMM
    # (blocked: float32, CPU; built on first use); auto: timed once per machine
    weight_layout: WeightLayout = WeightLayout.auto
    quantization: QuantizationScheme = QuantizationScheme.none  # the target's linear layers, stored at load
    quantization_group_size: int = 128  # int4: input features per scale and zero point (32, 64, 128, 256)
    heads: ModelHeads = field(default_factory=ModelHeads)
    example_prompt: Optional[str] = None  # the prompt a run generates for when none is set


@dataclass
class DraftConfig:
    kind: DraftKind = DraftKind.none
    path: Optional[str] = None  # a draft head directory in the published EAGLE / EAGLE-3 layout
    dtype: DType = DType.auto  # auto = the target's
    quantization: QuantizationScheme = QuantizationScheme.none  # the draft's own linear layers
    quantization_group_size: int = 128


@dataclass
class SpeculativeConfig:
    algorithm: SpeculativeAlgorithm = SpeculativeAlgorithm.none
    num_steps: int = 0
    topk: int = 1
    num_draft_tokens: Optional[int] = None  # counts the root (bonus) token; null: num_steps + 1 (topk=1)
    attention_mode: AttentionMode = AttentionMode.prefill
    draft_attention_backend: Optional[AttentionBackendName] = None
    draft_sampling: DraftSampling = DraftSampling.sample
    # sampled requests: reproducible (output equal to plain decoding's for a seed) | rejection (speculative
    # rejection sampling: more drafts accepted, distributed as plain decoding but not the same draws)
    verify: VerifyMode = VerifyMode.rejection
    # structured output: drafts follow each request's grammar (the head's steps masked, rejected drafts
    # cut before verification); false: only the target's choices are masked
    mask_drafts: bool = True
    # topk > 1: trees keep the nodes of highest cumulative log-softmax(draft logits / this); 1 = EAGLE-2's
    # scores. The shipped heads' probabilities are under-confident (top-1 0.38 on average where the
    # target agrees 0.78 of the time): 0.3 measured best for them.
    tree_score_temperature: float = 0.3
    # ngram: the request's suffix matched against its own earlier tokens, longest first, min..max tokens
    ngram_min_match: int = 1
    ngram_max_match: int = 4
    # hybrid: a cycle drafts with the lookup alone when every request matched a suffix this long
    ngram_trust: int = 2
    hybrid_lookup: HybridLookup = HybridLookup.ngram  # the hybrid rule's lookup: ngram | suffix
    # suffix: matches measured up to this many tokens; a match of m tokens drafts at most factor x m
    suffix_max_match: int = 32
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1  # a draft token needs this share of the match's occurrences behind it
    suffix_max_tokens: int = 262144  # tokens kept over every request's stream, the oldest finished ones dropped first


@dataclass
class AttentionConfig:
    backend: AttentionBackendName = AttentionBackendName.torch_native
    prefill_backend: Optional[AttentionBackendName] = None  # extend-like forwards; null = `backend`
    decode_backend: Optional[AttentionBackendName] = None  # one-token forwards; null = `backend`
    # the target's decode and verify attend one query per call (torch_native), so a verified position is
    # computed bit for bit as a decode would: null = on for a quantized or half-precision target
    batch_invariant: Optional[bool] = None
    # forwards that carry a logprobs request compute each position as a lone one-token decode would
    # (batch-invariant attention, row-invariant GEMMs, eager), so logprobs equal plain decoding's bit
    # for bit under speculation: null = on with torch_native
    exact_logprobs: Optional[bool] = None


@dataclass
class AdaptiveTier:
    batch_size: int = MISSING  # batches up to this size (padded up) use this tier
    # step counts to choose from (sorted, >= 0), then tree shapes {num_steps, topk, num_draft_tokens}
    candidates: list[Any] = MISSING


def _default_tiers() -> list[AdaptiveTier]:
    return [AdaptiveTier(1, [1, 3, 5, 7]), AdaptiveTier(8, [0, 1, 3]), AdaptiveTier(32, [0, 1]), AdaptiveTier(64, [0])]


@dataclass
class AdaptiveConfig:
    policy: AdaptivePolicy = AdaptivePolicy.off
    tiers: list[AdaptiveTier] = field(default_factory=_default_tiers)  # sorted by batch_size
    ema_alpha: float = 0.2  # weight of the newest cycle in every moving average
    update_interval: int = 5  # cycles between decisions
    warmup_batches: int = 10  # ema: cycles before the first decision
    down_hysteresis: float = -0.25  # ema: added to the threshold for fewer steps
    up_hysteresis: float = 0.0  # ema: added to the threshold for more steps
    probe_interval: int = 6  # throughput: decisions between probes of a neighbour (0 = never)


def _sampling_config() -> type:
    """The `sampling` group: SamplingParams' fields as the config declares them (`logit_bias` untyped, so a
    command-line dict replaces it; `structured_output` is a request's, not a run's)."""
    fields = []
    for f in dataclasses.fields(SamplingParams):
        if f.name == "structured_output":
            continue
        kind = Any if f.name == "logit_bias" else f.type
        if isinstance(kind, types.UnionType):  # `int | None` -> Optional[int], the spelling OmegaConf reads
            kind = Optional[next(arg for arg in typing.get_args(kind) if arg is not type(None))]
        default = None if f.name == "logit_bias" else f.default
        fields.append((f.name, kind, field(default_factory=f.default_factory) if default is dataclasses.MISSING
                       else field(default=default)))
    config = dataclasses.make_dataclass("SamplingConfig", fields)
    config.__module__ = __name__
    return config


SamplingConfig = _sampling_config()


@dataclass
class CacheConfig:
    page_size: int = 16
    max_total_tokens: int = 32768  # KV pool size in tokens (rounded down to whole pages)
    max_running_requests: int = 64
    max_prefill_tokens: int = 1024  # prompt tokens one step computes (a longer prompt is prefilled in chunks)
    max_context_len: Optional[int] = None  # default: the model's max_position_embeddings
    prefix_caching: bool = True  # reuse the KV (target and draft) of prefixes earlier sequences computed


GraphMode = choices("GraphMode", GRAPH_MODES)  # engine/graphs/settings.py


@dataclass
class GraphsConfig:
    mode: GraphMode = GraphMode.eager
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    max_context: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048, 4096])
    warmup: bool = True
    cache_dir: Optional[str] = None


@dataclass
class ChatTemplateConfig:
    """Per-role formats ({content} is the message text), the generation prompt, and turn-ending stops."""

    system: str = "System: {content}\n"
    user: str = "User: {content}\n"
    assistant: str = "Assistant: {content}\n"
    generation_prompt: str = "Assistant:"
    stop: list[str] = field(default_factory=lambda: ["\nUser:"])
    from_model: bool = True  # the checkpoint's own chat template when it has one; false: the formats above


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: Optional[str] = None  # null: the model directory's name
    max_queue: int = 256  # requests accepted but not yet running; beyond it: 503
    max_body_bytes: int = 8388608  # a larger request body is answered 413 before it is read
    api_key: Optional[str] = None  # set: every /v1 request needs `Authorization: Bearer <key>`
    log_level: str = "warning"
    chat_template: ChatTemplateConfig = field(default_factory=ChatTemplateConfig)


class ReplicaLauncher(Choice):
    none = "none"  # one server process
    ray = "ray"  # Ray Serve replicas behind one ingress


ReplicaRouting = choices("ReplicaRouting", ROUTINGS)  # engine/serve/replicas/routing.py says what each is


@dataclass
class PrefixRoutingConfig:
    """replicas.routing=prefix: a request follows the replica it shares the longest prefix with."""

    min_match_ratio: float = 0.3  # of the request's text a replica must hold for the prefix to decide
    max_imbalance: int = 4  # requests waiting for a first token over the least loaded replica: load beats prefix
    max_load_ratio: float = 3.0  # ...or in flight, past max_imbalance over the least loaded one's and this times it
    chunk_chars: int = 64  # prefixes are matched in chunks of this many characters (bytes of UTF-8)
    max_chunks: int = 65536  # chunks remembered per replica, least recently routed forgotten first


@dataclass
class ReplicasConfig:
    launcher: ReplicaLauncher = ReplicaLauncher.none
    num_replicas: int = 2
    routing: ReplicaRouting = ReplicaRouting.prefix
    prefix: PrefixRoutingConfig = field(default_factory=PrefixRoutingConfig)
    address: Optional[str] = None  # null: a local Ray cluster on this machine; else the cluster to join
    cpus_per_replica: float = 1.0  # Ray CPUs each replica holds (and its torch threads when num_threads is null)
    max_ongoing_requests: int = 64  # per replica; more wait in the ingress until one has room
    retries: int = 2  # sends to another replica of a request whose replica died before answering
    first_part_timeout_s: float = 600.0  # a request no replica started answering by then: 504


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    graphs: GraphsConfig = field(default_factory=GraphsConfig)
    device: Device = Device.auto
    num_threads: Optional[int] = None  # CPU threads of torch's kernels; null: torch's default, one per core
    seed: int = 0
    prompt: Optional[str] = None
    prompts_file: Optional[str] = None  # one prompt per line, or JSONL with a "prompt" field
    # prompts as user messages in the checkpoint's chat template: null = when the checkpoint has one
    chat: Optional[bool] = None
    objective: str = "tokens_per_s"  # the metric a run returns to a sweeper
    print_outputs: bool = True
    server: Optional[ServerConfig] = None  # python -m eyas.launch.serve (conf/serve.yaml) sets it
    replicas: Optional[ReplicasConfig] = None  # the server's replicas (conf/serve.yaml sets it)


def typed_config(values: dict, cls: type = None):
    """A resolved plain config (checked against the schema already) -> the schema's dataclasses (`Config`
    unless `cls` names a group's class)."""
    cls = cls or Config
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"unknown config keys {unknown}; allowed: {sorted(names)}")
    return cls(**{name: _typed(hints[name], value) for name, value in values.items()})


def _typed(kind, value):
    if value is None:
        return None
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # Optional[X]
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    if dataclasses.is_dataclass(kind):
        return typed_config(value, kind)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        return [_typed(item, v) for v in value]
    return value
