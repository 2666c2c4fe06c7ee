"""SpeculativeWorker: one speculative iteration for a batch with ragged acceptance, for any drafter.

New requests prefill: target extend over the prompt, first token sampled, then the drafter starts
on them (EAGLE: draft-extend over the prompt shifted by one; n-gram: index the prompt). Running
requests (committed length L, pending bonus b): the drafter proposes up to k tokens, the target
verifies [b, d_1..d_w] in one forward at positions L..L+w, the accepted drafts plus one target
token are emitted, L += accept_len, and the drafter sees the verified rows (EAGLE: draft-extend;
n-gram: index update). Target KV written at rejected positions is never read: the next verify
overwrites it, and masks only read below the committed length. With topk > 1 the drafter proposes
a tree, verified under a tree mask.

A drafter implements `start(requests, out, first)`, `prepare(requests)` (before drafting: catch up on
work held while its head sat out, timed as the `catch_up` phase), `propose(requests, sampling) -> drafts [B, w]`
(w <= k; -1 where a request has no more drafts), `propose_tree(requests, sampling, bonus, topk, num_nodes) -> DraftTree` and
`after_verify(requests, prefix_lens, emitted, out, keep)`, and carries `num_steps` (bound here).

Everything that depends on the step count comes from the bound `SpecRuntimeState`. With adaptive
speculation a controller picks the candidate (step count or tree shape) before each decode iteration, the worker switches to
that candidate's prebuilt state (a rebinding, between iterations), and the controller is fed the
host-side accept counts and phase times after each verify.
"""

import time

import torch

from engine.forward_batch import ForwardBatch
from engine.request import Request
from engine.runner import ModelRunner
from engine.sampling import Sampler, SamplingBatch
from engine.speculative.bindings import bind_runtime_state
from engine.speculative.metrics import SpecCounters
from engine.speculative.state import SpecRuntimeState
from engine.speculative.verify import accept_lengths, walk_tree


class SpeculativeWorker:
    def __init__(self, target_runner: ModelRunner, drafter, req_to_token: torch.Tensor, sampler: Sampler,
                 initial_state: SpecRuntimeState):
        self.target_runner = target_runner
        self.drafter = drafter  # EagleDraftWorker | NgramDrafter
        self.req_to_token = req_to_token
        self.sampler = sampler
        self.counters = SpecCounters()
        self.candidate_states: dict = {}  # candidate (step count or TreeShape) -> its SpecRuntimeState
        self.controller = None
        # bound by bind_runtime_state
        self.state = self.num_steps = self.verify_backend = self.verify_buffers = None
        bind_runtime_state(self, initial_state)

    def apply_runtime_state(self, state: SpecRuntimeState) -> bool:
        """Switch to `state` (between iterations); False when it is already the live one."""
        if state is self.state:
            return False
        bind_runtime_state(self, state)
        return True

    def enable_adaptive(self, candidate_states: dict, controller) -> "SpeculativeWorker":
        """candidate_states: a prebuilt state per candidate (step count or TreeShape) the controller may choose."""
        missing = set(controller.all_candidates) - set(candidate_states)
        if missing:
            raise ValueError(f"adaptive controller proposes candidates without a runtime state: {sorted(map(str, missing))}")
        self.candidate_states = candidate_states
        self.controller = controller
        return self

    def step(self, requests: list[Request]) -> list[list[int]]:
        new = [r for r in requests if r.num_computed == 0]
        running = [r for r in requests if r.num_computed > 0]
        emitted = {}
        if new:
            emitted.update(zip(map(id, new), self.prefill(new)))
        if running:
            emitted.update(zip(map(id, running), self.decode(running)))
        return [emitted[id(r)] for r in requests]

    def prefill(self, requests: list[Request]) -> list[list[int]]:
        rows = [r.row for r in requests]
        # a preempted request comes back with output: it extends prompt + output
        batch = ForwardBatch.from_tails(rows, [r.all_ids for r in requests], [0] * len(requests), self.req_to_token)
        out = self.target_runner.forward(batch)
        first = self.sampler.sample(out.logits, SamplingBatch.of_requests(requests, out.logits.device))[:, 0].tolist()
        for request in requests:
            request.num_computed = request.seq_len
        self.drafter.start(requests, out, first)
        return [[t] for t in first]

    def decode(self, requests: list[Request]) -> list[list[int]]:
        if self.controller is not None:
            self.apply_runtime_state(self.candidate_states[self.controller.choose(len(requests))])
        clock = _PhaseClock(self.req_to_token.device, sync=self.controller is not None and self.controller.needs_timings)
        self.drafter.prepare(requests)
        clock.lap(CATCH_UP_PHASE)
        k, b = self.num_steps, len(requests)
        rows = [r.row for r in requests]
        seq_lens = [r.num_computed for r in requests]
        sampling = SamplingBatch.of_requests(requests, self.req_to_token.device)
        bonus = torch.tensor([r.output_ids[-1] for r in requests], dtype=torch.int64)
        if self.state.topk > 1:
            return self._decode_tree(requests, rows, seq_lens, sampling, bonus, clock)
        drafts = self.drafter.propose(requests, sampling)  # [B, w], w <= k; -1: no draft there
        clock.lap("draft")
        w = drafts.shape[1]
        chain = self.verify_buffers.fill_chain(bonus.to(drafts.device), drafts)  # [B, w+1]
        proposed = (drafts >= 0).sum(dim=1)  # [B]
        if bool((proposed < w).any()):  # the target reads some token at a hole; it is never accepted
            chain = chain.clamp(min=0)
        batch = ForwardBatch.from_tails(rows, chain, seq_lens, self.req_to_token)
        out = self.target_runner.forward(batch, logits_indices=self.verify_buffers.indices(b, w),
                                         attn_backend=self.verify_backend)
        tokens = self.sampler.sample(out.logits, sampling, width=w + 1)  # [B, w+1]: the target's own choices
        accept_lens = accept_lengths(drafts.to(tokens.device), tokens)
        emitted = [row[:n] for row, n in zip(tokens.tolist(), accept_lens.tolist())]
        proposed = proposed.tolist()

        # commit, then let the drafter see the verified rows (bonus and accepted drafts)
        keep = torch.tensor([i * (w + 1) + j for i, e in enumerate(emitted) for j in range(len(e))],
                            dtype=torch.int64, device=chain.device)
        for request, tokens_i, n in zip(requests, emitted, proposed):
            request.num_computed += len(tokens_i)
            self.counters.record(n, len(tokens_i))
            request.spec_counters.record(n, len(tokens_i))
        clock.lap("verify")
        self.drafter.after_verify(requests, seq_lens, emitted, out, keep)
        clock.lap("extend")
        if self.controller is not None:
            self.controller.observe(b, self.state.candidate, [len(e) - 1 for e in emitted], clock.times)
        return emitted

    def _decode_tree(self, requests: list[Request], rows: list[int], seq_lens: list[int], sampling: SamplingBatch,
                     bonus: torch.Tensor, clock: "_PhaseClock") -> list[list[int]]:
        """One tree iteration: draft an EAGLE-2 tree per request, verify all its nodes in one target
        forward under the tree mask, walk it, move the accepted path's target KV to the committed
        positions, then draft-extend over that path."""
        device = self.req_to_token.device
        tree = self.drafter.propose_tree(requests, sampling, bonus.to(device), self.state.topk,
                                         self.state.num_draft_tokens)
        clock.lap("draft")
        b, n = tree.tokens.shape
        prefix = torch.tensor(seq_lens, dtype=torch.int64, device=device)
        batch = ForwardBatch.for_tree(rows, tree.tokens.clamp(min=0), seq_lens, prefix[:, None] + tree.depths,
                                      tree.ancestor_mask(), self.req_to_token)
        out = self.target_runner.forward(batch, logits_indices=torch.arange(b * n, device=device),
                                         attn_backend=self.verify_backend)
        target = self.sampler.sample(out.logits, sampling, width=n, offsets=tree.depths)  # [B, n]
        accept_lens, path = walk_tree(tree, target, use_kernel=device.type == "cuda")
        lens = accept_lens.tolist()
        chosen = target.gather(1, path.clamp(min=0)).tolist()
        emitted = [row[:m] for row, m in zip(chosen, lens)]
        on_path = path >= 0  # [B, n]: the path's nodes, root first, then padding
        self._commit_tree_kv(batch.req_rows, prefix, path, on_path)
        keep = (torch.arange(b, device=device)[:, None] * n + path)[on_path]  # packed rows of the path's nodes
        for request, tokens_i in zip(requests, emitted):
            request.num_computed += len(tokens_i)
            self.counters.record(self.num_steps, len(tokens_i))  # by depth: position i = depth i + 1
            request.spec_counters.record(self.num_steps, len(tokens_i))
        clock.lap("verify")
        self.drafter.after_verify(requests, seq_lens, emitted, out, keep)
        clock.lap("extend")
        if self.controller is not None:
            self.controller.observe(b, self.state.candidate, [len(e) - 1 for e in emitted], clock.times)
        return emitted

    def _commit_tree_kv(self, rows: torch.Tensor, prefix: torch.Tensor, path: torch.Tensor,
                        on_path: torch.Tensor) -> None:
        """The accepted path's i-th node was verified at column L + path[i]; its target KV belongs at
        column L + i. Copy it there (every layer) where the two differ; the rest of the tree's columns
        are overwritten by the next verify and never read before. rows, prefix: [B]; path, on_path: [B, n]."""
        moved = on_path & (path != torch.arange(path.shape[1], device=path.device))  # [B, n]
        if not bool(moved.any()):
            return
        table_rows = rows[:, None].expand_as(path)[moved]
        src = self.req_to_token[table_rows, (prefix[:, None] + path)[moved]]
        dst = self.req_to_token[table_rows, (prefix[:, None] + torch.arange(path.shape[1], device=path.device))[moved]]
        pool = self.target_runner.kv_pool
        for layer in range(pool.num_layers):  # reads happen before writes: overlapping moves are safe
            pool.k[layer][dst] = pool.k[layer][src]
            pool.v[layer][dst] = pool.v[layer][src]

    def stats(self) -> dict:
        stats = self.counters.as_dict()
        if self.controller is not None:
            stats.update(self.controller.stats())
        return stats


# the phase of an iteration that catches the head up on cycles it sat out: a cost of the switch back
# to drafting with it, which an adaptive policy keeps out of the cost of the candidate it switched to
CATCH_UP_PHASE = "catch_up"


class _PhaseClock:
    """Wall time of each phase of one iteration, in seconds (synchronised on CUDA when `sync`)."""

    def __init__(self, device: torch.device, sync: bool):
        self.cuda = sync and torch.device(device).type == "cuda"
        self.times: dict[str, float] = {}
        self._last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, phase: str) -> None:
        now = self._now()
        self.times[phase] = now - self._last
        self._last = now
