"""The top container: composes models, cache and runtime from one config (the schema's dataclasses)."""

from dependency_injector import containers, providers

from eyas.containers import factories
from eyas.containers.adaptive import build_candidate_states
from eyas.containers.background_graphs import background_graphs
from eyas.containers.cache import CacheContainer
from eyas.containers.models import ModelContainer
from eyas.containers.scope import BuildTrackingSingleton as Singleton
from eyas.containers.speculative import SpeculativeContainer
from eyas.engine.attention.registry import BACKENDS
from eyas.engine.config.schema import Config
from eyas.engine.engine import Engine
from eyas.engine.request_builder import RequestBuilder
from eyas.engine.runner import ModelRunner
from eyas.engine.sampling import Sampler
from eyas.engine.scheduler import Scheduler
from eyas.engine.speculative.adaptive.acceptance import AcceptanceModel
from eyas.engine.speculative.adaptive.controller import AdaptiveController
from eyas.engine.speculative.adaptive.ema import EmaPolicy
from eyas.engine.speculative.adaptive.throughput import ThroughputPolicy
from eyas.engine.speculative.adaptive.tiers import build_tiers
from eyas.engine.speculative.worker import SpeculativeWorker
from eyas.engine.stopping import StopChecker
from eyas.engine.structured.grammars import GrammarCompiler
from eyas.engine.worker import DecodeWorker


class EngineContainer(containers.DeclarativeContainer):
    __self__ = providers.Self()
    config = providers.Dependency(instance_of=Config)  # checked and resolved (`containers.build`)

    models = providers.Container(ModelContainer, config=config)
    lookahead_tokens = providers.Callable(
        factories.lookahead_tokens, config.provided.speculative.algorithm,
        providers.Callable(factories.speculative_shapes, config.provided.speculative, config.provided.adaptive))
    cache = providers.Container(
        CacheContainer, config=config.provided.cache, device=models.device, target_model=models.target_model,
        lookahead_tokens=lookahead_tokens,
    )

    # attention.batch_invariant, resolved for the target
    batch_invariant = providers.Callable(
        factories.batch_invariant_attention, config.provided.attention.batch_invariant,
        config.provided.attention.backend, models.quantization, config.provided.graphs.mode,
        providers.Callable(factories.model_dtype_of, models.target_model), models.device)
    # attention backends by name; each call builds a fresh backend (backends hold per-batch metadata)
    target_attention_backend = providers.Factory(
        factories.attention_backend, providers.Object(BACKENDS), config.provided.attention.backend,
        providers.Callable(factories.head_dim_of, models.target_model), batch_invariant,
    )

    sampler = Singleton(Sampler)
    req_to_token = cache.req_to_token.provided.table
    graph_settings = Singleton(factories.graph_settings_for, config.provided.graphs, models.device)
    speculative = providers.Container(
        SpeculativeContainer, config=config, device=models.device, target_model=models.target_model,
        num_pages=cache.num_pages, req_to_token=req_to_token, verify_backend=target_attention_backend,
        sampler=sampler, graph_settings=graph_settings, target_pool=cache.target_pool,
        target_checkpoint=models.checkpoint, batch_invariant=batch_invariant,
    )
    # the target captures the layers the draft head reads, told when it is built
    target_runner = Singleton(
        ModelRunner, model=models.target_model, kv_pool=cache.target_pool, attn_backend=target_attention_backend,
        capture_layers=speculative.capture_layers,
    )
    decode_graph = Singleton(factories.graph_runner, graph_settings, models.target_model, cache.target_pool,
                             req_to_token, "decode", max_width=1)
    # graphs.mode=auto: the decode runner swapped in once a background process has compiled its packages
    decode_graph_later = providers.Factory(factories.background_runner, graph_settings, models.target_model,
                                           cache.target_pool, req_to_token, "decode", max_width=1)
    exact_logprobs = providers.Callable(factories.exact_logprobs, config.provided.attention.exact_logprobs, config.provided.attention.backend)
    decode_worker = Singleton(DecodeWorker, runner=target_runner, req_to_token=req_to_token, sampler=sampler,
                              graph=decode_graph, exact_logprobs=exact_logprobs)
    spec_worker = Singleton(
        SpeculativeWorker, target_runner=target_runner, drafter=speculative.drafter, req_to_token=req_to_token,
        sampler=sampler, initial_state=speculative.runtime_state, verify=config.provided.speculative.verify,
        mask_drafts=config.provided.speculative.mask_drafts, exact_logprobs=exact_logprobs,
    )

    # adaptive speculation: one policy per batch-size tier, one prebuilt runtime state per candidate
    adaptive_tiers = providers.Callable(
        build_tiers, providers.Callable(factories.adaptive_tiers, config.provided.adaptive), providers.Callable(factories.configured_candidate, config.provided.speculative))
    acceptance_model = Singleton(AcceptanceModel, decay=providers.Callable(factories.decay_of, config.provided.adaptive.ema_alpha))
    ema_policy = providers.Factory(
        EmaPolicy, ema_alpha=config.provided.adaptive.ema_alpha, update_interval=config.provided.adaptive.update_interval,
        warmup_batches=config.provided.adaptive.warmup_batches, down_hysteresis=config.provided.adaptive.down_hysteresis,
        up_hysteresis=config.provided.adaptive.up_hysteresis,
    )
    throughput_policy = providers.Factory(
        ThroughputPolicy, acceptance=acceptance_model, ema_alpha=config.provided.adaptive.ema_alpha,
        update_interval=config.provided.adaptive.update_interval, probe_interval=config.provided.adaptive.probe_interval,
    )
    make_policy = providers.Selector(config.provided.adaptive.policy, ema=ema_policy.provider, throughput=throughput_policy.provider)
    # sampled batches learn apart: their own acceptance model
    sampled_acceptance_model = Singleton(
        AcceptanceModel, decay=providers.Callable(factories.decay_of, config.provided.adaptive.ema_alpha))
    sampled_throughput_policy = providers.Factory(
        ThroughputPolicy, acceptance=sampled_acceptance_model, ema_alpha=config.provided.adaptive.ema_alpha,
        update_interval=config.provided.adaptive.update_interval, probe_interval=config.provided.adaptive.probe_interval,
    )
    make_sampled_policy = providers.Selector(config.provided.adaptive.policy, ema=ema_policy.provider,
                                             throughput=sampled_throughput_policy.provider)
    adaptive_controller = Singleton(AdaptiveController, tiers=adaptive_tiers, make_policy=make_policy,
                                    make_sampled_policy=make_sampled_policy)
    candidate_states = Singleton(
        build_candidate_states, __self__, providers.Callable(factories.adaptive_candidates, config.provided.adaptive),
    )
    adaptive_worker = Singleton(
        factories.enable_adaptive, worker=spec_worker, states=candidate_states, controller=adaptive_controller,
    )
    speculative_worker = providers.Selector(
        config.provided.adaptive.policy, off=spec_worker, ema=adaptive_worker, throughput=adaptive_worker,
    )
    worker = providers.Selector(
        providers.Callable(factories.worker_kind, config.provided.speculative.algorithm),
        plain=decode_worker, speculative=speculative_worker,
    )
    scheduler = Singleton(
        Scheduler, kv=cache.manager, max_running_requests=config.provided.cache.max_running_requests,
        max_prefill_tokens=config.provided.cache.max_prefill_tokens, lookahead_tokens=lookahead_tokens,
        cacheable_len=worker.provided.cacheable_len, released=worker.provided.release,
    )
    stop_checker = Singleton(
        StopChecker, tokenizer=models.tokenizer, eos_token_ids=models.eos_token_ids,
        max_context_len=cache.max_context_len,
    )
    default_sampling = providers.Factory(factories.sampling_params, config.provided.sampling)
    grammars = Singleton(
        GrammarCompiler, tokenizer_json=providers.Callable(factories.tokenizer_json, models.tokenizer),
        vocab_size=providers.Callable(factories.vocab_size, models.target_model), eos_token_ids=models.eos_token_ids,
    )
    request_builder = Singleton(
        RequestBuilder, tokenizer=models.tokenizer, default_sampling=default_sampling, seed=config.provided.seed,
        vocab_size=providers.Callable(factories.vocab_size, models.target_model), grammars=grammars,
    )
    graphs_in_background = Singleton(
        background_graphs, graph_settings, __self__, config, config.provided.cache.max_running_requests,
        batch_invariant, providers.Callable(factories.graphs_attend_per_query, models.target_model, models.device))
    engine = Singleton(
        Engine, tokenizer=models.tokenizer, scheduler=scheduler, worker=worker, stop_checker=stop_checker,
        requests=request_builder, device=models.device,
        warmup_graphs=providers.Callable(factories.warms_graphs, graph_settings, config.provided.graphs.warmup),
        graphs=graphs_in_background,
    )
