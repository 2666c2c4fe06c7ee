"""Candidate runtime states of adaptive speculation, each built under a `ProviderScope` that sets the
candidate (drafter, step count, tree shape) for the duration of the build and leaves the live worker
exactly as it was."""

from dependency_injector import providers

from eyas.containers.scope import BindingGuard, BuildTrackingSingleton, ProviderScope
from eyas.engine.speculative.bindings import restore_bindings, snapshot_bindings
from eyas.engine.speculative.candidate import Candidate
from eyas.engine.speculative.state import SpecRuntimeState


def live_bindings(container) -> BindingGuard:
    """Snapshots the live SpeculativeWorker's bindings, if it has been built."""
    worker = container.spec_worker

    def snapshot():
        return (worker(), snapshot_bindings(worker())) if worker.built else None

    def restore(saved):
        live, bindings = saved
        restore_bindings(live, bindings)

    return BindingGuard(snapshot, restore)


def speculative_scope(container, candidate: Candidate) -> ProviderScope:
    """A scope in which `container.speculative` builds for `candidate`."""
    return ProviderScope(
        overrides={container.speculative.candidate: providers.Object(candidate)},
        singletons=container.traverse(types=[BuildTrackingSingleton]),
        bindings=live_bindings(container),
        key=container,
    )


def build_adaptive_runtime_state(container, candidate: Candidate) -> SpecRuntimeState:
    with speculative_scope(container, candidate):
        return container.speculative.runtime_state()


def build_candidate_states(container, candidates: list) -> dict:
    """The live worker's state plus one state per other candidate. The live worker is built first,
    outside any scope, so every shared singleton (models, pools, draft state) is built with the
    configured values."""
    live = container.spec_worker()
    states = {live.state.candidate: live.state}
    for candidate in candidates:
        if candidate not in states:
            states[candidate] = build_adaptive_runtime_state(container, candidate)
    return states
