"""Admits waiting requests while KV and batch slots allow, grows running requests' KV step by step,
and releases KV the moment a request ends.

Admission is first come, first served. A request holds KV for the positions it has reached plus the
`lookahead_tokens` one step may write past them, and gets more pages as it grows. When the pool
cannot give a running request its next pages, the most recently admitted request is preempted: its
KV is freed and it goes back to the front of the queue with its output kept; on readmission it
prefills prompt + output again and goes on (sampling is keyed by output position, so a seeded
request emits the same tokens). The oldest request never waits on a younger one, so every request
finishes. A request that could not fit even alone in the empty pool fails at `add`, with the reason.
"""

from collections import deque

from engine.cache.manager import KVCacheManager
from engine.request import Request, Status


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_running_requests: int, max_prefill_tokens: int, lookahead_tokens: int = 0):
        self.kv = kv
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.lookahead_tokens = lookahead_tokens  # extra KV positions a speculative step may write
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

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

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Request]:
        """Give running requests KV for their next step (preempting the newest when short), admit what
        fits, and return every running request (new and readmitted ones extend their whole sequence)."""
        self._grow_running()
        budget, admitted = self.max_prefill_tokens, 0
        while self.waiting and len(self.running) < self.max_running_requests:
            request = self.waiting[0]
            # a prompt longer than the whole budget still runs, alone in its step
            if (admitted and request.seq_len > budget) or not self.kv.can_admit(self.step_tokens_for(request)):
                break
            self.waiting.popleft()
            request.row = self.kv.admit(self.step_tokens_for(request))
            request.status = Status.RUNNING
            self.running.append(request)
            budget -= request.seq_len
            admitted += 1
        return list(self.running)

    def _grow_running(self) -> None:
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if self.kv.grow(request.row, self.step_tokens_for(request)):
                i += 1
            else:  # the newest running request gives its KV back (possibly this one)
                self._preempt(self.running.pop())

    def _preempt(self, request: Request) -> None:
        self.kv.release(request.row)
        request.row = None
        request.num_computed = 0
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def abort(self, requests: list[Request], reason: str, finish_reason: str = "error") -> None:
        """End `requests` where they stand (waiting or running) and free their KV."""
        for request in requests:
            if not request.finished:
                request.fail(reason, finish_reason)
        self.waiting = deque(r for r in self.waiting if not r.finished)
        self.release_finished()

    def release_finished(self) -> list[Request]:
        done = [r for r in self.running if r.finished]
        for request in done:
            self.kv.release(request.row)
            request.row = None
        self.running = [r for r in self.running if not r.finished]
        return done
