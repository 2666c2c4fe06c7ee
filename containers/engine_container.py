"""The top container: composes models, cache and runtime from one plain config dict."""

from operator import attrgetter

from dependency_injector import containers, providers

from containers import factories
from containers.cache import CacheContainer
from containers.models import ModelContainer
from containers.speculative import SpeculativeContainer
from engine.attention.registry import BACKENDS
from engine.engine import Engine
from engine.runner import ModelRunner
from engine.sampling import Sampler
from engine.scheduler import Scheduler
from engine.speculative.worker import EagleWorker
from engine.stopping import StopChecker
from engine.worker import DecodeWorker


class EngineContainer(containers.DeclarativeContainer):
    config = providers.Configuration(strict=True)

    models = providers.Container(ModelContainer, config=config)
    lookahead_tokens = providers.Callable(
        factories.lookahead_tokens, config.speculative.algorithm, config.speculative.num_steps)
    cache = providers.Container(
        CacheContainer, config=config.cache, device=models.device, target_model=models.target_model,
        lookahead_tokens=lookahead_tokens,
    )

    # attention backends by name; each call builds a fresh backend (backends hold per-batch metadata)
    target_attention_backend = providers.Factory(
        factories.attention_backend, providers.Object(BACKENDS), config.attention.backend,
        providers.Callable(factories.head_dim_of, models.target_model),
    )

    target_runner = providers.Singleton(
        ModelRunner, model=models.target_model, kv_pool=cache.target_pool, attn_backend=target_attention_backend,
    )
    sampler = providers.Singleton(Sampler)
    req_to_token = providers.Callable(attrgetter("table"), cache.req_to_token)
    speculative = providers.Container(
        SpeculativeContainer, config=config, device=models.device, target_model=models.target_model,
        num_pages=cache.num_pages, req_to_token=req_to_token,
    )
    decode_worker = providers.Singleton(DecodeWorker, runner=target_runner, req_to_token=req_to_token, sampler=sampler)
    eagle_worker = providers.Singleton(
        EagleWorker, target_runner=target_runner, draft_worker=speculative.draft_worker, req_to_token=req_to_token,
        sampler=sampler, num_steps=config.speculative.num_steps,
    )
    # the draft head must load before the target runs: it chooses which target layers to capture
    worker = providers.Selector(config.speculative.algorithm, none=decode_worker, eagle=eagle_worker, eagle3=eagle_worker)
    scheduler = providers.Singleton(
        Scheduler, kv=cache.manager, max_running_requests=config.cache.max_running_requests,
        max_prefill_tokens=config.cache.max_prefill_tokens, lookahead_tokens=lookahead_tokens,
    )
    stop_checker = providers.Singleton(
        StopChecker, tokenizer=models.tokenizer, eos_token_ids=models.eos_token_ids,
        max_context_len=cache.max_context_len,
    )
    default_sampling = providers.Factory(factories.sampling_params, config.sampling)
    engine = providers.Singleton(
        Engine, tokenizer=models.tokenizer, scheduler=scheduler, worker=worker, stop_checker=stop_checker,
        default_sampling=default_sampling, seed=config.seed, device=models.device,
    )
