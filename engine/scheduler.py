"""Admits waiting requests while KV and batch slots allow, and releases KV the moment a request ends.

Admission is first come, first served. A request reserves KV for its longest possible sequence; a
request that could not fit even in an empty pool fails alone at `add`, with the reason.
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

    def kv_tokens_for(self, request: Request) -> int:
        longest = min(len(request.prompt_ids) + request.params.max_new_tokens, self.kv.max_context_len)
        return longest + self.lookahead_tokens

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
        """Admit what fits, then return every running request (new ones extend their prompt)."""
        budget, admitted = self.max_prefill_tokens, 0
        while self.waiting and len(self.running) < self.max_running_requests:
            request = self.waiting[0]
            prompt_len = len(request.prompt_ids)
            # a prompt longer than the whole budget still runs, alone in its step
            if (admitted and prompt_len > budget) or not self.kv.can_admit(self.kv_tokens_for(request)):
                break
            self.waiting.popleft()
            request.row = self.kv.admit(self.kv_tokens_for(request))
            request.status = Status.RUNNING
            self.running.append(request)
            budget -= prompt_len
            admitted += 1
        return list(self.running)

    def abort(self, requests: list[Request], reason: str) -> None:
        """End `requests` where they stand (waiting or running) with an error, and free their KV."""
        for request in requests:
            if not request.finished:
                request.fail(reason)
        self.waiting = deque(r for r in self.waiting if not r.finished)
        self.release_finished()

    def release_finished(self) -> list[Request]:
        done = [r for r in self.running if r.finished]
        for request in done:
            self.kv.release(request.row)
            request.row = None
        self.running = [r for r in self.running if not r.finished]
        return done
