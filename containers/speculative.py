"""The draft side of speculative decoding: head, its KV pool and runner, backend factory, draft worker."""

from dependency_injector import containers, providers

from containers import factories
from containers.scope import BuildTrackingSingleton as Singleton
from engine.attention.registry import BACKENDS
from engine.models.draft_loader import load_draft
from engine.runner import ModelRunner
from engine.speculative.backend_factory import DraftBackendFactory
from engine.speculative.chain_buffers import ChainBuffers
from engine.speculative.draft_worker import EagleDraftWorker
from engine.speculative.hybrid_drafter import HybridDrafter
from engine.speculative.ngram_drafter import NgramDrafter
from engine.speculative.standalone_drafter import StandaloneDrafter
from engine.speculative.state import SpecRuntimeState
from engine.speculative.verify_buffers import VerifyBuffers


class SpeculativeContainer(containers.DeclarativeContainer):
    config = providers.Configuration()  # the whole config
    device = providers.Dependency()
    target_model = providers.Dependency()
    num_pages = providers.Dependency()
    req_to_token = providers.Dependency()  # the shared request-to-token tensor
    verify_backend = providers.Dependency()  # builds a fresh target attention backend per call
    sampler = providers.Dependency()

    # the step count, tree shape and drafter a runtime state is built for (None: the configured drafter);
    # adaptive speculation overrides them in a scope
    num_steps = providers.Callable(int, config.speculative.num_steps)
    topk = providers.Callable(int, config.speculative.topk)
    num_draft_tokens = providers.Callable(int, config.speculative.num_draft_tokens)
    drafter_choice = providers.Object(None)

    draft_model = Singleton(
        load_draft, path=config.draft.path, kind=config.draft.kind, target=target_model,
        dtype=config.draft.dtype, device=device, weight_layout=config.model.weight_layout,
        target_path=config.model.path,
    )
    draft_pool = Singleton(factories.draft_kv_pool, draft_model, num_pages, config.cache.page_size, device)
    draft_head_dim = providers.Callable(factories.head_dim_of, draft_model)
    # the draft runner's own backend, kept when no draft-extend backend is created
    draft_runner_backend = providers.Factory(
        factories.attention_backend, providers.Object(BACKENDS), config.attention.backend, draft_head_dim,
    )
    draft_runner = Singleton(ModelRunner, model=draft_model, kv_pool=draft_pool, attn_backend=draft_runner_backend)
    head_backend_factory = providers.Factory(
        DraftBackendFactory,
        backend_classes=providers.Object(BACKENDS),
        head_dim=draft_head_dim,
        num_steps=num_steps,
        attention_mode=config.speculative.attention_mode,
        prefill_backend=providers.Callable(factories.backend_or_default, config.attention.prefill_backend,
                                           config.attention.backend),
        decode_backend=providers.Callable(factories.backend_or_default, config.attention.decode_backend,
                                          config.attention.backend),
        draft_attention_backend=config.speculative.draft_attention_backend,
    )
    chain_buffers = Singleton(
        ChainBuffers, max_requests=config.cache.max_running_requests,
        hidden_size=providers.Callable(factories.hidden_size_of, draft_model),
        vocab_size=providers.Callable(factories.draft_vocab_size_of, draft_model),
        dtype=providers.Callable(factories.model_dtype_of, draft_model), device=device,
    )
    eagle_drafter = Singleton(
        EagleDraftWorker, draft_runner=draft_runner, req_to_token=req_to_token, buffers=chain_buffers,
        sampler=sampler, draft_sampling=config.speculative.draft_sampling,
        tree_score_temperature=config.speculative.tree_score_temperature,
    )
    standalone_drafter = Singleton(
        StandaloneDrafter, draft_runner=draft_runner, req_to_token=req_to_token, buffers=chain_buffers,
        sampler=sampler, draft_sampling=config.speculative.draft_sampling,
        tree_score_temperature=config.speculative.tree_score_temperature,
    )
    ngram_drafter = Singleton(
        NgramDrafter, min_match=config.speculative.ngram_min_match, max_match=config.speculative.ngram_max_match,
        max_branches=providers.Callable(factories.max_topk, config.speculative, config.adaptive), device=device,
    )
    hybrid_drafter = Singleton(
        HybridDrafter, draft_runner=draft_runner, req_to_token=req_to_token, buffers=chain_buffers,
        sampler=sampler, draft_sampling=config.speculative.draft_sampling,
        tree_score_temperature=config.speculative.tree_score_temperature, ngram=ngram_drafter,
        ngram_trust=config.speculative.ngram_trust,
        mode=providers.Callable(factories.hybrid_mode, config.speculative.algorithm),
    )
    # the drafter `speculative.algorithm` names (the hybrid, as the head alone, when adaptive tiers list
    # other drafters); n-gram loads no draft model and has no draft backends
    drafter = providers.Selector(
        providers.Callable(factories.drafter_name, config.speculative.algorithm, config.adaptive),
        eagle=eagle_drafter, eagle3=eagle_drafter, ngram=ngram_drafter, standalone=standalone_drafter,
        hybrid=hybrid_drafter,
    )
    backend_factory = providers.Selector(
        providers.Callable(factories.draft_backends_of, config.speculative.algorithm, drafter_choice),
        head=head_backend_factory, none=providers.Object(None),
    )
    verify_buffers = providers.Factory(
        VerifyBuffers, max_requests=config.cache.max_running_requests, num_steps=num_steps, device=device,
    )
    # everything that depends on the step count, built fresh on each call
    runtime_state = providers.Factory(
        SpecRuntimeState.create, num_steps=num_steps, backend_factory=backend_factory, verify_backend=verify_backend,
        verify_buffers=verify_buffers, topk=topk, num_draft_tokens=num_draft_tokens, drafter=drafter_choice,
    )
