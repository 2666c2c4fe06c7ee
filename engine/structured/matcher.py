"""One request's grammar state: the tokens its output may take next, along any path of drafts."""

import itertools

import torch

class GrammarMatcher:
    """Wraps an llguidance matcher that has consumed the request's output so far (`num_consumed`
    tokens). `stopped_at`: the output length at which the grammar was complete (no token but eos may
    follow), the request's end."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.num_consumed = 0
        self.stopped_at: int | None = None
        self.error: str | None = None  # a token the grammar refused (the request fails with this)

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next (llguidance's byte per token, 0 or not: measured
        faster here than unpacking its bitmask)."""
        allowed = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8)
        return allowed[:self.vocab_size].bool()

    def walk(self, tokens: list[int], parents: list[int]) -> tuple[list[bool], torch.Tensor]:
        """A draft tree's nodes (tokens [N], node 0 the root, already consumed; parents [N], parents before
        children): (valid [N]: the node's token and its ancestors' are allowed where they stand, the
        root always; masks [N, V] bool: what the grammar allows after each valid node, all True after an
        invalid one, which is never on an accepted path). The matcher ends where it started."""
        n = len(tokens)
        everything = torch.ones(self.vocab_size, dtype=torch.bool)
        masks = [everything] * n
        valid, complete = [False] * n, [False] * n
        valid[0] = True
        stack: list[int] = []  # the nodes consumed beyond the root, root-side first
        for j in range(n):
            if j > 0:
                parent = parents[j]
                if not valid[parent] or not 0 <= tokens[j] < self.vocab_size or not bool(masks[parent][tokens[j]]):
                    continue
                valid[j] = True
                if complete[parent]:  # eos after the grammar's end: the last node of its path, never consumed
                    masks[j] = torch.zeros_like(everything)  # (consuming it would not be rolled back)
                    continue
                path = self._path(j, parents)
                common = 0
                while common < min(len(stack), len(path)) and stack[common] == path[common]:
                    common += 1
                if len(stack) > common:
                    self.matcher.rollback(len(stack) - common)
                    del stack[common:]
                for node in path[common:]:
                    self.matcher.consume_token(tokens[node])
                    stack.append(node)
            complete[j] = self.matcher.is_stopped()
            masks[j] = self.allowed()  # complete: eos alone (or nothing) may follow
        if stack:
            self.matcher.rollback(len(stack))
        return valid, torch.stack(masks)

    def forced_chain(self, tokens: list[int]) -> list[int]:
        """A draft chain's tokens (node 0 the root, already consumed) with its drafts from the first one the
        grammar rejects (or an unfilled one) replaced by the tokens the grammar forces there (llguidance's
        fast-forward tokens: the forced bytes, canonically tokenized), unfilled past them. The matcher ends
        where it started."""
        out, consumed = list(tokens), 0
        for token in tokens[1:]:
            if (self.matcher.is_stopped() or not 0 <= token < self.vocab_size
                    or self.matcher.validate_tokens([token]) != 1):
                break
            self.matcher.consume_token(token)
            consumed += 1
        start = consumed + 1
        if start < len(out) and not self.matcher.is_stopped():
            forced = list(itertools.takewhile(lambda t: 0 <= t < self.vocab_size,
                                              self.matcher.compute_ff_tokens()))[:len(out) - start]
            out[start:] = forced + [-1] * (len(out) - start - len(forced))
        if consumed:
            self.matcher.rollback(consumed)
        return out

    def masks_after(self, paths: list[list[int]]) -> torch.Tensor:
        """[len(paths), V] bool: what the grammar allows after each path of tokens from where it stands
        (all True after a path it rejects, which verification cuts); the matcher ends where it started."""
        everything = torch.ones(self.vocab_size, dtype=torch.bool)
        masks = []
        for path in paths:
            consumed = 0
            for token in path:  # checked first: a rejected token would leave the matcher in error for good
                if self.matcher.is_stopped() or self.matcher.validate_tokens([token]) != 1:
                    break
                self.matcher.consume_token(token)
                consumed += 1
            masks.append(self.allowed() if consumed == len(path) else everything)
            if consumed:
                self.matcher.rollback(consumed)
        return torch.stack(masks)

    @staticmethod
    def _path(node: int, parents: list[int]) -> list[int]:
        path = []
        while node > 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def consume(self, tokens: list[int]) -> None:
        """The request's newly emitted tokens, in order (those after the grammar completed are not its)."""
        for token in tokens:
            if self.stopped_at is not None or self.error is not None:
                return
            if not self.matcher.consume_token(token):  # only a row without any allowed choice gets here
                self.error = f"token {token} breaks the request's structured output: {self.matcher.get_error()}"
                return
            self.num_consumed += 1
            if self.matcher.is_stopped():
                self.stopped_at = self.num_consumed

    def draft_state(self) -> "DraftWalk":
        return DraftWalk(self)


class DraftWalk:
    """A draft chain's walk through the grammar: the mask for each step's draft, each draft consumed
    tentatively, everything rolled back by `close`. A draft the grammar does not allow (nothing else
    was left) ends the walk: later steps go unmasked, and verification cuts them."""

    def __init__(self, grammar: GrammarMatcher):
        self.grammar = grammar
        self.consumed = 0
        self.alive = True

    def mask(self) -> torch.Tensor | None:
        """[V] bool for the next draft, or None (unmasked)."""
        if not self.alive:
            return None
        allowed = self.grammar.allowed()
        return allowed if bool(allowed.any()) else None

    def advance(self, token: int, allowed: torch.Tensor | None) -> None:
        if not self.alive or allowed is None or not bool(allowed[token]) or self.grammar.matcher.is_stopped():
            self.alive = False  # (a token after the grammar's end is never consumed: it would not roll back)
            return
        self.grammar.matcher.consume_token(token)
        self.consumed += 1

    def close(self) -> None:
        if self.consumed:
            self.grammar.matcher.rollback(self.consumed)
        self.consumed = 0
