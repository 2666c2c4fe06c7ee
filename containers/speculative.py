"""The draft side of speculative decoding: the draft model, its KV pool and runner, backend factory,
the drafters, and the runtime state of one candidate."""

from dependency_injector import containers, providers

from eyas.containers import factories
from eyas.containers.drafter_parts import ContainerDrafterParts
from eyas.containers.scope import BuildTrackingSingleton as Singleton
from eyas.engine.attention.registry import BACKENDS
from eyas.engine.config.schema import Config
from eyas.engine.models.draft_loader import load_draft
from eyas.engine.runner import ModelRunner
from eyas.engine.speculative.backend_factory import DraftBackendFactory
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.drafters.draft_state_buffers import DraftStateBuffers
from eyas.engine.speculative.drafters.head import DraftHead
from eyas.engine.speculative.state import SpecRuntimeState
from eyas.engine.speculative.verify_buffers import VerifyBuffers


class SpeculativeContainer(containers.DeclarativeContainer):
    config = providers.Dependency(instance_of=Config)
    device = providers.Dependency()
    target_model = providers.Dependency()
    num_pages = providers.Dependency()
    req_to_token = providers.Dependency()  # the shared request-to-token tensor
    verify_backend = providers.Dependency()  # builds a fresh target attention backend per call
    sampler = providers.Dependency()
    graph_settings = providers.Dependency()
    target_pool = providers.Dependency()
    batch_invariant = providers.Dependency(instance_of=bool)  # the target attends batch-invariant: trees verify eager
    target_checkpoint = providers.Dependency()  # the target's Hugging Face directory

    # the candidate a runtime state is built for; adaptive speculation overrides it in a scope
    candidate = providers.Factory(
        Candidate, num_steps=config.provided.speculative.num_steps, topk=config.provided.speculative.topk,
        num_draft_tokens=config.provided.speculative.num_draft_tokens,
    )

    draft_model = Singleton(
        load_draft, path=config.provided.draft.path, kind=config.provided.draft.kind, target=target_model,
        dtype=config.provided.draft.dtype, device=device, weight_layout=config.provided.model.weight_layout,
        target_path=target_checkpoint, quantization=config.provided.draft.quantization,
        quantization_group_size=config.provided.draft.quantization_group_size,
    )
    # the target layers whose input an EAGLE-3 head reads (none for other drafters)
    capture_layers = providers.Selector(
        config.provided.draft.kind, eagle=providers.Object(()), lm=providers.Object(()), none=providers.Object(()),
        eagle3=providers.Callable(factories.capture_layers_of, draft_model, target_model),
    )
    draft_pool = Singleton(factories.draft_kv_pool, draft_model, num_pages, config.provided.cache.page_size, device)
    draft_head_dim = draft_model.provided.config.head_dim
    # the draft runner's own backend, kept when no draft-extend backend is created
    draft_runner_backend = providers.Factory(
        factories.attention_backend, providers.Object(BACKENDS), config.provided.attention.backend, draft_head_dim,
    )
    draft_runner = Singleton(ModelRunner, model=draft_model, kv_pool=draft_pool, attn_backend=draft_runner_backend)
    head_backend_factory = providers.Factory(
        DraftBackendFactory,
        backend_classes=providers.Object(BACKENDS),
        head_dim=draft_head_dim,
        num_steps=candidate.provided.num_steps,
        attention_mode=config.provided.speculative.attention_mode,
        prefill_backend=providers.Callable(factories.backend_or_default, config.provided.attention.prefill_backend,
                                           config.provided.attention.backend),
        decode_backend=providers.Callable(factories.backend_or_default, config.provided.attention.decode_backend,
                                          config.provided.attention.backend),
        draft_attention_backend=config.provided.speculative.draft_attention_backend,
    )
    draft_state_buffers = Singleton(
        DraftStateBuffers, max_requests=config.provided.cache.max_running_requests,
        hidden_size=draft_model.provided.config.hidden_size, vocab_size=draft_model.provided.draft_vocab_size,
        dtype=providers.Callable(factories.model_dtype_of, draft_model), device=device,
    )
    head = Singleton(
        DraftHead, runner=draft_runner, req_to_token=req_to_token, buffers=draft_state_buffers, sampler=sampler,
        draft_sampling=config.provided.speculative.draft_sampling, tree_score_temperature=config.provided.speculative.tree_score_temperature,
        verify=config.provided.speculative.verify,
    )
    # what each drafter is built from (`registry.DrafterParts`); the head loads only when a drafter asks for it
    drafter_parts = Singleton(
        ContainerDrafterParts, algorithm=config.provided.speculative.algorithm, spec=config.provided.speculative,
        max_branches=providers.Callable(factories.max_topk, config.provided.speculative, config.provided.adaptive),
        lookups=providers.Callable(factories.lookups, config.provided.speculative, config.provided.adaptive), head=head.provider,
    )
    # the drafter the worker drafts with (`factories.drafter_name`), built as its registry row says
    drafter = Singleton(
        factories.drafter_of, drafter_parts,
        providers.Callable(factories.drafter_name, config.provided.speculative.algorithm, config.provided.adaptive),
    )
    backend_factory = providers.Selector(
        providers.Callable(factories.draft_backends_of, config.provided.speculative.algorithm, candidate),
        head=head_backend_factory, none=providers.Object(None),
    )
    verify_buffers = providers.Factory(
        VerifyBuffers, max_requests=config.provided.cache.max_running_requests,
        num_draft_tokens=candidate.provided.num_draft_tokens, device=device,
    )
    # the target's verify forwards as graphs (None: eager)
    verify_graph = providers.Factory(
        factories.graph_runner, graph_settings, target_model, target_pool, req_to_token, "verify", capture_layers,
        chains_only=batch_invariant,
    )
    # the draft model's step forwards as graphs (None: eager, or no draft model)
    draft_graph = providers.Selector(
        providers.Callable(factories.draft_backends_of, config.provided.speculative.algorithm, candidate),
        head=providers.Factory(factories.graph_runner, graph_settings, draft_model, draft_pool, req_to_token, "draft",
                               max_width=1),
        none=providers.Object(None),
    )
    # graphs.mode=auto: the runners swapped in once a background process has compiled their packages
    verify_graph_later = providers.Factory(
        factories.background_runner, graph_settings, target_model, target_pool, req_to_token, "verify", capture_layers,
        chains_only=batch_invariant,
    )
    draft_graph_later = providers.Factory(
        factories.background_runner, graph_settings, draft_model, draft_pool, req_to_token, "draft", max_width=1,
    )
    # everything that depends on the candidate, built fresh on each call
    runtime_state = providers.Factory(
        SpecRuntimeState.create, candidate=candidate, backend_factory=backend_factory, verify_backend=verify_backend,
        verify_buffers=verify_buffers, verify_graph=verify_graph, draft_graph=draft_graph,
    )
