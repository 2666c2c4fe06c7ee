"""Stop conditions, checked token by token: eos, stop token ids, stop strings, max_new_tokens, context length."""

import time

from eyas.engine.request import Request, Status
from eyas.engine.tokenizer import Tokenizer


class StopChecker:
    def __init__(self, tokenizer: Tokenizer | None, eos_token_ids: tuple[int, ...], max_context_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context_len = max_context_len

    def append(self, request: Request, token: int) -> bool:
        """Append one generated token; return True when the request is finished by it (a token its
        grammar refused fails it, and it alone)."""
        if request.grammar is not None and request.grammar.error is not None:
            request.fail(request.grammar.error)
            return True
        request.output_ids.append(token)
        if request.first_token_time is None:
            request.first_token_time = time.perf_counter()
        reason = self._reason(request, token)
        if reason is not None:
            request.status = Status.FINISHED
            request.finish_reason = reason
            request.finish_time = time.perf_counter()
        return reason is not None

    def _stop_text_end(self, output_ids: list[int], stops: list[str]) -> int | None:
        """Where the output text is cut: the start of the earliest stop string in it, or None.

        A stop string that appears for the first time ends in the newest token, so only a tail of the
        output is decoded per token (a tail of 2 tokens per stop-string character is far more than
        any stop string spans); the whole output is decoded once, when a stop string shows in the tail."""
        window = 2 * max(len(s) for s in stops) + 8
        tail = self.tokenizer.decode(output_ids[-window:]) if len(output_ids) > window else None
        if tail is not None and not any(s in tail for s in stops):
            return None
        text = self.tokenizer.decode(output_ids)
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        return min(hits) if hits else None

    def _reason(self, request: Request, token: int) -> str | None:
        params = request.params
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop"
        grammar = request.grammar
        if grammar is not None and grammar.stopped_at is not None and len(request.output_ids) >= grammar.stopped_at:
            return "stop"  # the structured output is complete
        if token in params.stop_token_ids:  # the text ends before it, as before a stop string
            if self.tokenizer is not None:
                request.stop_text_end = len(self.tokenizer.decode(request.output_ids[:-1]))
            return "stop"
        if params.stop and self.tokenizer is not None:
            end = self._stop_text_end(request.output_ids, params.stop)
            if end is not None:
                request.stop_text_end = end
                return "stop"
        if len(request.output_ids) >= params.max_new_tokens or request.seq_len >= self.max_context_len:
            return "length"
        return None
