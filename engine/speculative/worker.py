"""SpeculativeWorker: one speculative iteration for a batch with ragged acceptance, for any drafter.

New requests prefill: target extend over the prompt, first token sampled, then the drafter starts
on them. Running requests (committed length L, pending bonus b) go through one iteration:

    propose -> verify -> commit -> extend

the drafter proposes a draft tree rooted at b (a chain is the one-child tree), the target verifies
all its nodes in one forward and accepts a path, the path's tokens are committed (L grows by the
accepted drafts plus the target's own token), and the drafter sees the verified path (draft-extend,
index update). `decode` wraps the iteration in its bookkeeping: the adaptive controller's choice of
candidate before it, the phase clock, the counters and the controller's feed after it.

Everything that depends on the candidate comes from the live `SpecRuntimeState` (`self.state`),
bound by `bindings.bind_runtime_state`; switching candidates is a rebinding between iterations.
"""

import dataclasses
import logging
import time

import torch

from eyas.engine.forward_batch import ForwardBatch, wants_exact
from eyas.engine.graphs.exported import PackageMissing
from eyas.engine.phase_clock import CATCH_UP_PHASE, PhaseClock, PhaseListener
from eyas.engine.request import Request
from eyas.engine.runner import ModelRunner
from eyas.engine.sampling import Sampler, SamplingBatch
from eyas.engine.shared_prefill import Siblings
from eyas.engine.spec_metrics import SpecCounters
from eyas.engine.speculative.bindings import bind_runtime_state
from eyas.engine.speculative.commit import commit
from eyas.engine.speculative.drafters.base import Drafter
from eyas.engine.speculative.state import SpecRuntimeState
from eyas.engine.speculative.verify import TargetVerifier, Verified

log = logging.getLogger("eyas.graphs")


class SpeculativeWorker:
    def __init__(self, target_runner: ModelRunner, drafter: Drafter, req_to_token: torch.Tensor, sampler: Sampler,
                 initial_state: SpecRuntimeState, verify: str = "reproducible", mask_drafts: bool = True,
                 exact_logprobs: bool = True):
        self.target_runner = target_runner
        self.drafter = drafter
        self.req_to_token = req_to_token
        self.sampler = sampler
        self.exact_logprobs = exact_logprobs  # logprobs requests' forwards run `exact` (ForwardBatch.exact)
        self.verifier = TargetVerifier(target_runner, req_to_token, sampler, verify, exact_logprobs)
        self.mask_drafts = mask_drafts  # structured output: drafts follow the requests' grammars
        self.counters = SpecCounters()
        self.candidate_states: dict = {}  # Candidate -> its SpecRuntimeState
        self.controller = None
        self.state: SpecRuntimeState | None = None  # bound by bind_runtime_state
        self._decode_end: float | None = None  # when the last iteration ended (None: a prefill ran since)
        self.phase_listeners: list[PhaseListener] = []  # hear each decode iteration's phases (a benchmark's timer)
        bind_runtime_state(self, initial_state)

    def apply_runtime_state(self, state: SpecRuntimeState) -> bool:
        """Switch to `state` (between iterations); False when it is already the live one."""
        if state is self.state:
            return False
        bind_runtime_state(self, state)
        return True

    def enable_adaptive(self, candidate_states: dict, controller) -> "SpeculativeWorker":
        """candidate_states: a prebuilt state per candidate the controller may choose."""
        missing = set(controller.all_candidates) - set(candidate_states)
        if missing:
            raise ValueError(f"adaptive controller proposes candidates without a runtime state: {sorted(map(str, missing))}")
        self.candidate_states = candidate_states
        self.controller = controller
        return self

    @torch.inference_mode()  # every tensor of a step is an inference tensor (graph runners see one kind)
    def step(self, requests: list[Request]) -> list[list[int]]:
        new = [r for r in requests if not r.prefilled]
        running = [r for r in requests if r.prefilled]
        emitted = {}
        if new:
            emitted.update(zip(map(id, new), self.prefill(new)))
            self._decode_end = None  # the time since the last iteration holds this prefill
        if running:
            emitted.update(zip(map(id, running), self.decode(running)))
        return [emitted[id(r)] for r in requests]

    def prefill(self, requests: list[Request]) -> list[list[int]]:
        # a prompt's n samples run its forward once (`shared_prefill`)
        siblings = Siblings.of(requests, [not r.output_ids and r.chunk_end is None for r in requests])
        computed = [requests[i] for i in siblings.computed]
        # from the end of its cached prefix (to the end of its chunk when chunked); a preempted request comes
        # back with output: it extends prompt + output
        starts = [r.num_computed for r in requests]
        lens = [len(r.step_ids) for r in requests]
        batch = ForwardBatch.from_tails([r.row for r in computed], [r.step_ids for r in computed],
                                        [r.num_computed for r in computed], self.req_to_token)
        batch.exact = self.exact_logprobs and wants_exact(requests)
        out = self.target_runner.forward(batch)
        if siblings.shared:
            siblings.copy_kv(requests, self.target_runner.kv_pool, self.req_to_token)
            out = siblings.expand(out, batch.extend_lens)
        for request in requests:
            request.num_computed = request.chunk_end or request.seq_len
        done = [i for i, r in enumerate(requests) if r.chunk_end is None]
        chunked = [i for i, r in enumerate(requests) if r.chunk_end is not None]
        if chunked:  # a chunk of a long prompt: the drafter sees it, nothing is sampled yet
            self.drafter.prefill_chunk([requests[i] for i in chunked], [starts[i] for i in chunked],
                                       out.of_requests(lens, chunked))
        emitted = [[] for _ in requests]
        if done:
            finished = [requests[i] for i in done]
            out = out if not chunked else out.of_requests(lens, done)
            first = self.sampler.next_tokens(out.logits, finished, SamplingBatch.of_requests(finished, out.logits.device))
            for request in finished:
                request.prefilled = True
            self.drafter.start(finished, [starts[i] for i in done], out, first)
            for i, token in zip(done, first):
                emitted[i] = [token]
        return emitted

    def decode(self, requests: list[Request]) -> list[list[int]]:
        """One iteration, with its bookkeeping around it."""
        sampled = 2 * sum(not r.params.greedy for r in requests) > len(requests)  # most requests sample
        if self.controller is not None:
            self.apply_runtime_state(self.candidate_states[self.controller.choose(len(requests), sampled)])
        clock = PhaseClock(self.req_to_token.device, sync=self.controller is not None and self.controller.needs_timings,
                           listeners=self.phase_listeners)
        self.drafter.prepare(requests, self.state)
        clock.lap(CATCH_UP_PHASE)
        verified = self.iterate(requests, clock)
        for request, tokens, reach in zip(requests, verified.emitted, verified.reach):
            self.counters.record(reach, len(tokens))
            request.spec_counters.record(reach, len(tokens))
        clock.add_gap(self._decode_end)
        if self.controller is not None:
            self.controller.observe(len(requests), self.state.candidate, [len(e) - 1 for e in verified.emitted],
                                    clock.times, sampled)
        self._decode_end = time.perf_counter()
        return verified.emitted

    def iterate(self, requests: list[Request], clock: PhaseClock) -> Verified:
        """propose -> verify -> commit -> extend, on the live runtime state."""
        state = self.state
        # the positions this cycle samples: the drafts' and the verified nodes' (depth 0 .. num_steps)
        sampling = SamplingBatch.of_requests(requests, self.req_to_token.device, horizon=state.candidate.num_steps + 1,
                                             mask_drafts=self.mask_drafts)
        bonus = torch.tensor([r.output_ids[-1] for r in requests], dtype=torch.int64, device=self.req_to_token.device)
        tree = self.drafter.propose(requests, sampling, bonus, state)
        clock.lap("draft")
        verified = self.verifier.verify(requests, tree, sampling, state)
        commit(requests, verified, tree.is_chain, self.target_runner.kv_pool, self.req_to_token)
        clock.lap("verify")
        self.drafter.after_verify(requests, verified, state)
        clock.lap("extend")
        return verified

    def warmup_graphs(self, max_batch_size: int) -> None:
        """Compile every verify and draft-step graph the runtime states can run with batches up to
        `max_batch_size` (runners of one model share graphs: one per shape class, whatever the width)."""
        self._warm([self.state, *self.candidate_states.values()], max_batch_size)

    def install_graphs(self, runners_for, max_batch_size: int) -> bool:
        """Between iterations (`graphs.mode=auto`): every runtime state is replaced by a copy that holds the
        graph runners `runners_for(candidate)` gives, `(verify, draft)`, once they have loaded every package
        they run, and the live state is rebound to its copy (`apply_runtime_state`, as a candidate switch
        is). False, and every state as it was, when a package is missing."""
        states = self.candidate_states or {self.state.candidate: self.state}
        swapped = {}
        for candidate, state in states.items():
            verify, draft = runners_for(candidate)
            swapped[candidate] = dataclasses.replace(state, verify_graph=verify, draft_graph=draft)
        try:
            self._warm(list(swapped.values()), max_batch_size)
        except PackageMissing as exc:
            log.info("graphs.mode=auto: speculative decoding stays eager: %s", exc)
            return False
        if self.candidate_states:
            self.candidate_states.update(swapped)  # the same dict the container built
        self.apply_runtime_state(swapped[self.state.candidate])
        return True

    def _warm(self, states: list[SpecRuntimeState], max_batch_size: int) -> None:
        for state in {id(s): s for s in states}.values():
            for batch_size in sorted({1, min(2, max_batch_size)}):
                if state.verify_graph is not None:
                    state.verify_graph.warmup(batch_size, state.candidate.num_draft_tokens,
                                              tree=not state.candidate.is_chain)
                if state.draft_graph is not None and state.candidate.num_steps > 1:  # steps after the first
                    self.drafter.head.warmup_graph(state.draft_graph, batch_size)

    def cacheable_len(self, request: Request) -> int:
        """Leading positions of the request whose KV is final in the target's pool and the drafter's."""
        return min(request.num_computed, self.drafter.kv_valid_len(request))

    def release(self, request: Request) -> None:
        """The request gave its row back (ended or preempted): the drafter lets go of its state there."""
        self.drafter.release(request)

    def stats(self) -> dict:
        stats = self.counters.as_dict()
        if self.controller is not None:
            stats.update(self.controller.stats())
        return stats
