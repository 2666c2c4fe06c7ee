"""NgramIndex: one request's own tokens (prompt + output), indexed for prompt lookup.

For every n in min_match..max_match, each n-gram that has a token after it maps to the positions
where it ended, newest first (at most `max_branches` of them). Appending a token indexes only the
n-grams that now have a continuation (the ones ending just before it), so the cost per committed
token is max_match - min_match + 1 dict updates, never a rescan. Lookup matches the request's
current suffix, longest n first: the continuation after an earlier occurrence of that suffix is the
proposal (vLLM's prompt lookup; several occurrences become branches of a tree).
"""


class NgramIndex:
    def __init__(self, tokens: list[int], min_match: int, max_match: int, max_branches: int = 1):
        self.min_match, self.max_match, self.max_branches = min_match, max_match, max_branches
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> end positions, newest first
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            end = len(self.tokens) - 1  # the n-grams ending here now have a continuation: `token`
            self.tokens.append(token)
            for n in range(self.min_match, min(self.max_match, end + 1) + 1):
                key = tuple(self.tokens[end - n + 1:end + 1])
                ends = self._ends.get(key)
                if ends is None:
                    self._ends[key] = [end]
                else:
                    ends.insert(0, end)
                    del ends[self.max_branches:]

    def propose(self, max_tokens: int) -> list[list[int]]:
        """Up to `max_branches` distinct continuations of at most `max_tokens` tokens each, best
        first: the newest occurrence of the longest matching suffix, then older ones and shorter
        suffixes. Empty when no suffix of min_match tokens occurred before."""
        return [branch for _, branch in self.matches(max_tokens)]

    def matches(self, max_tokens: int) -> list[tuple[int, list[int]]]:
        """`propose`'s continuations, each with the length of the suffix it matched."""
        found: list[tuple[int, list[int]]] = []
        size = len(self.tokens)
        for n in range(min(self.max_match, size - 1), self.min_match - 1, -1):
            for end in self._ends.get(tuple(self.tokens[size - n:]), ()):
                branch = self.tokens[end + 1:end + 1 + max_tokens]
                if all(branch != b for _, b in found):
                    found.append((n, branch))
                    if len(found) == self.max_branches:
                        return found
        return found
