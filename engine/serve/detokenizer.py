"""Incremental detokenization for streaming: each piece released is final, and the pieces joined
equal the text the non-streamed response carries.

The whole output is decoded again as tokens arrive (cheap next to a decode step); what is released
stops short of a trailing incomplete UTF-8 character (decoded as U+FFFD) and of the last
`len(longest stop string) - 1` characters, which could still turn out to start a stop string.
"""

from eyas.engine.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.sent = ""
        self.text_len = 0  # characters the tokens so far decode to

    def add(self, token_ids: list[int]) -> str:
        """Take newly generated tokens; return the text that can be released now ("" if none)."""
        self.token_ids.extend(token_ids)
        text = self.tokenizer.decode(self.token_ids)
        self.text_len = len(text)
        end = len(text) - self.holdback
        while end > len(self.sent) and text[end - 1] == REPLACEMENT:
            end -= 1
        if end <= len(self.sent) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):end], text[:end]
        return piece

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` (the request's whole output text, cut at a matched stop string)."""
        if not final_text.startswith(self.sent):  # cannot happen with prefix-stable decoding; never resend
            return ""
        piece, self.sent = final_text[len(self.sent):], final_text
        return piece
