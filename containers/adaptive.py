"""Candidate runtime states of adaptive speculation, each built under a `ProviderScope` that sets the
step count for the duration of the build and leaves the live worker exactly as it was."""

from dependency_injector import providers

from containers.scope import BindingGuard, BuildTrackingSingleton, ProviderScope
from engine.speculative.bindings import restore_bindings, snapshot_bindings
from engine.speculative.state import SpecRuntimeState


def live_bindings(container) -> BindingGuard:
    """Snapshots the live SpeculativeWorker's bindings, if it has been built."""
    worker = container.spec_worker

    def snapshot():
        return (worker(), snapshot_bindings(worker())) if worker.built else None

    def restore(saved):
        live, bindings = saved
        restore_bindings(live, bindings)

    return BindingGuard(snapshot, restore)


def speculative_scope(container, num_steps: int) -> ProviderScope:
    """A scope in which `container.speculative.num_steps` is `num_steps`."""
    return ProviderScope(
        overrides={container.speculative.num_steps: providers.Object(num_steps)},
        singletons=container.traverse(types=[BuildTrackingSingleton]),
        bindings=live_bindings(container),
        key=container,
    )


def build_adaptive_runtime_state(container, num_steps: int) -> SpecRuntimeState:
    with speculative_scope(container, num_steps):
        return container.speculative.runtime_state()


def build_candidate_states(container, candidates: list[int]) -> dict[int, SpecRuntimeState]:
    """The live worker's state plus one state per other candidate. The live worker is built first,
    outside any scope, so every shared singleton (models, pools, draft state) is built with the
    configured values."""
    live = container.spec_worker()
    states = {live.state.num_steps: live.state}
    for k in candidates:
        if k not in states:
            states[k] = build_adaptive_runtime_state(container, k)
    return states
