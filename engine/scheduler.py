"""Admits waiting requests while KV and batch slots allow, grows running requests' KV step by step,
and releases KV the moment a request ends.

Admission is first come, first served. A request holds KV for the positions it has reached plus the
`lookahead_tokens` one step may write past them, and gets more pages as it grows. When the pool
cannot give a running request its next pages, the most recently admitted request is preempted: its
KV is freed and it goes back to the front of the queue with its output kept; on readmission it
prefills prompt + output again and goes on (sampling is keyed by output position, so a seeded
request emits the same tokens). The oldest request never waits on a younger one, so every request
finishes. A request that could not fit even alone in the empty pool fails at `add`, with the reason.

With a prefix cache, a request is admitted onto the cached KV of the longest prefix it shares with
earlier sequences and computes only the rest (`num_computed` starts past the match); its pages join
the cache as their KV becomes final, and when it ends or is preempted. `cacheable_len(request)` says
how many leading positions hold final KV in every pool (the worker's drafter may lag the target).
`released(request)` is told whenever a request gives its row back (ended or preempted): the worker's
drafter lets go of what it kept for that row.

Requests that share at least `HOLD_MIN_PAGES` pages past what the cache holds with a prefill of this step
wait one step (or until that prefill is done): admitted together, each would compute the shared prompt (a
system prompt many requests bring at once); a step later they find it cached. A shorter shared span (the
first words of two questions after a cached system prompt) is not worth a step of the request's latency.
Requests behind them that share nothing with a prefill under way are admitted meanwhile; the held ones stay
first in the queue. Identical prompts are not held back (their samples prefill once).

Chunked prefill: a step computes at most `max_prefill_tokens` prompt tokens. A prompt with more left
than that takes a chunk (`request.chunk_end`) and goes on next step, before anyone new is admitted,
while the running requests decode in the same steps: one long prompt stalls no stream.
"""

from collections import deque
from typing import Callable

from eyas.engine.cache.manager import KVCacheManager
from eyas.engine.request import Request, Status

HOLD_MIN_PAGES = 4  # uncached pages a waiting request must share with a prefill under way to wait for it


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_running_requests: int, max_prefill_tokens: int, lookahead_tokens: int = 0,
                 cacheable_len: Callable[[Request], int] | None = None,
                 released: Callable[[Request], None] | None = None):
        self.kv = kv
        self.cacheable_len = cacheable_len or (lambda request: request.num_computed)
        self.released = released or (lambda request: None)
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.lookahead_tokens = lookahead_tokens  # extra KV positions a speculative step may write
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.prompt_tokens_admitted = 0  # prompt tokens of first admissions
        self.cached_tokens_admitted = 0  # of them, found in the prefix cache

    def kv_tokens_for(self, request: Request) -> int:
        """KV positions of the request's longest possible sequence (at most the context limit) and of
        the lookahead its last step may write past it."""
        longest = min(len(request.prompt_ids) + request.params.max_new_tokens, self.kv.max_context_len)
        return longest + self.lookahead_tokens

    def step_tokens_for(self, request: Request) -> int:
        """KV positions the request's next step may touch."""
        return request.seq_len + self.lookahead_tokens

    def add(self, request: Request) -> None:
        error = self.admission_error(request)
        if error:
            request.fail(error)
        else:
            self.waiting.append(request)

    def admission_error(self, request: Request) -> str | None:
        prompt_len = len(request.prompt_ids)
        if prompt_len == 0:
            return "empty prompt: it encodes to no tokens"
        # the context limit, the same with or without speculation (its lookahead is table width only)
        if prompt_len >= self.kv.max_context_len:
            return (f"prompt of {prompt_len} tokens does not fit the context: it must be shorter than "
                    f"cache.max_context_len = {self.kv.max_context_len}")
        need = self.kv.pages_for(self.kv_tokens_for(request))
        if need > self.kv.allocator.num_pages:
            return (f"request needs {need} KV pages ({self.kv_tokens_for(request)} tokens) but the pool has "
                    f"{self.kv.allocator.num_pages}: raise cache.max_total_tokens or lower max_new_tokens")
        return None

    def stats(self) -> dict:
        stats = {"preemptions": self.num_preemptions}
        if self.kv.prefix_cache is not None:
            stats.update(cached_prompt_tokens=self.cached_tokens_admitted,
                         prefix_cache_hit_rate=self.cached_tokens_admitted / max(1, self.prompt_tokens_admitted),
                         prefix_cache_pages=self.kv.cached_pages)
        return stats

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Request]:
        """Give running requests KV for their next step (preempting the newest when short), go on with the
        prefills under way, admit what fits the prefill budget, and return the requests this step runs
        (new and readmitted ones extend their sequence past their cached prefix, in chunks when long)."""
        self._grow_running()
        budget = self.max_prefill_tokens
        prefilling = [r for r in self.running if not r.prefilled]
        for request in prefilling:  # prefills under way first, oldest first
            budget = self._chunk(request, budget)
        held = []  # waiting on a prefill of this step that computes their prefix
        while budget > 0 and self.waiting and len(self.running) < self.max_running_requests:
            request = self.waiting[0]
            matched = self.kv.match(request.all_ids)
            if self._shares_a_prefill(request, len(matched) * self.kv.page_size, prefilling):
                held.append(self.waiting.popleft())
                continue
            if not self.kv.can_admit(self.step_tokens_for(request), matched):
                break
            self.waiting.popleft()
            request.row = self.kv.admit(self.step_tokens_for(request), matched)
            request.num_computed = request.prefill_start = len(matched) * self.kv.page_size
            request.prefilled = False
            if request.num_cached_tokens is None:  # its first admission
                request.num_cached_tokens = request.num_computed
                self.prompt_tokens_admitted += len(request.prompt_ids)
                self.cached_tokens_admitted += request.num_computed
            request.status = Status.RUNNING
            self.running.append(request)
            prefilling.append(request)
            budget = self._chunk(request, budget)
        self.waiting.extendleft(reversed(held))  # first in the queue again, in their order
        # a prefill the budget left no room for this step sits it out
        return [r for r in self.running if r.chunk_end is None or r.chunk_end > r.num_computed]

    def _shares_a_prefill(self, request: Request, cached: int, prefilling: list[Request]) -> bool:
        """Whether `request` shares the `HOLD_MIN_PAGES` pages past its `cached` tokens with a prefill under way
        (and the token after them: the cache keys a page by its tokens and the next one)."""
        if self.kv.prefix_cache is None:
            return False
        ids, end = request.all_ids, cached + HOLD_MIN_PAGES * self.kv.page_size + 1
        if len(ids) <= end:  # it would compute its last pages anyway
            return False
        return any(len(other.all_ids) >= end and other.all_ids[:end] == ids[:end] and other.all_ids != ids
                   for other in prefilling)

    @staticmethod
    def _chunk(request: Request, budget: int) -> int:
        """Give a prefilling request its share of the step's prefill budget; the budget left."""
        left = request.seq_len - request.num_computed
        if left <= budget:
            request.chunk_end = None
            return budget - left
        request.chunk_end = request.num_computed + max(budget, 0)
        return 0

    def cache_progress(self) -> None:
        """Offer the prefix cache the pages running requests have made final (a shared system prompt is
        reused while its first request still runs)."""
        for request in self.running:
            copied_from, request.kv_copied_from = request.kv_copied_from, None
            if self.kv.prefix_cache is None or request.finished:
                continue
            if copied_from is not None:  # a sample of a prompt prefilled once: its copies may become shared pages
                self.kv.note_copy(request.row, copied_from, len(request.prompt_ids))
            valid = self.cacheable_len(request)
            if self.kv.caches_more(request.row, request.seq_len, valid):
                self.kv.cache(request.row, request.all_ids, valid)

    def _grow_running(self) -> None:
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if self.kv.grow(request.row, self.step_tokens_for(request)):
                i += 1
            else:  # the newest running request gives its KV back (possibly this one)
                self._preempt(self.running.pop())

    def _preempt(self, request: Request) -> None:
        self._release(request)
        request.row = None
        request.num_computed = 0
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def abort(self, requests: list[Request], reason: str, finish_reason: str = "error", cache: bool = True) -> None:
        """End `requests` where they stand (waiting or running) and free their KV. cache: False when a step
        broke off midway, so that KV it was writing is not offered to the prefix cache."""
        for request in requests:
            if not request.finished:
                request.fail(reason, finish_reason)
        self.waiting = deque(r for r in self.waiting if not r.finished)
        self.release_finished(cache)

    def release_finished(self, cache: bool = True) -> list[Request]:
        done = [r for r in self.running if r.finished]
        for request in done:
            self._release(request, cache)
            request.row = None
        self.running = [r for r in self.running if not r.finished]
        return done

    def _release(self, request: Request, cache: bool = True) -> None:
        if cache and request.prefilled:  # its KV as far as it is final joins the prefix cache
            self.kv.release(request.row, request.all_ids, self.cacheable_len(request))
        else:
            self.kv.release(request.row)
        self.released(request)
