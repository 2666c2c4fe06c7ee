"""Grammars from a request's `structured_output`, compiled by llguidance over the model's tokenizer.

llguidance, measured against xgrammar on this CPU (`python -m eyas.bench structured --mask-cost`): both
compute a 4096-token mask in tens of microseconds, far below a decode step; llguidance needs no other
package (xgrammar brings transformers), and its matcher validates a run of drafts and rolls back, what
verification needs. It is the optional extra `structured`.
"""

import json
import threading
from collections import OrderedDict

from eyas.engine.errors import ConfigError

MAX_GRAMMARS = 256  # compiled grammars kept, the most recently used
KINDS = ("json_schema", "json_object", "regex", "grammar")  # grammar: Lark syntax, as llguidance reads it
ANY_JSON_OBJECT = {"type": "object"}
# JSON without free whitespace (separators "," and ":"): a small model may add newlines forever where
# the grammar allows any run of them, and never end its object
JSON_LAYOUT = {"whitespace_flexible": False}


def validate_spec(spec, prefix: str = "sampling.structured_output") -> None:
    """A spec names exactly one of `KINDS` with a value of its type."""
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise ConfigError(f"{prefix} must have exactly one of the keys {list(KINDS)}, got {spec!r}")
    kind, value = next(iter(spec.items()))
    if kind == "json_schema" and not isinstance(value, (dict, str, bool)):
        raise ConfigError(f"{prefix}.json_schema must be a JSON schema (an object or its JSON text), got {value!r}")
    if kind == "json_object" and value is not True:
        raise ConfigError(f"{prefix}.json_object must be true, got {value!r}")
    if kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
        raise ConfigError(f"{prefix}.{kind} must be a non-empty string, got {value!r}")


def grammar_text(spec: dict, prefix: str = "sampling.structured_output") -> str:
    """The llguidance grammar of a valid spec."""
    import llguidance

    kind, value = next(iter(spec.items()))
    try:
        if kind in ("json_schema", "json_object"):
            schema = ANY_JSON_OBJECT if kind == "json_object" else json.loads(value) if isinstance(value, str) else value
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(value)
        return llguidance.LLMatcher.grammar_from_lark(value)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix}.{kind}: {e}") from None


class GrammarCompiler:
    """Compiles specs into matchers over one tokenizer (its llguidance form built on first use); each
    request gets a copy of its spec's compiled matcher (copying measured ~20 us against tens of ms to
    compile a large schema)."""

    def __init__(self, tokenizer_json: str | None, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self._lock = threading.Lock()  # the server compiles on its HTTP side, the engine on its loop
        self._tokenizer = None
        self._matchers: OrderedDict[str, object] = OrderedDict()  # spec (as JSON) -> a fresh compiled matcher

    def _ll_tokenizer(self):
        try:
            import llguidance
        except ImportError:
            raise ConfigError("sampling.structured_output needs llguidance: pip install 'eyas[structured]'") from None
        if self.tokenizer_json is None:
            raise ConfigError("sampling.structured_output needs the model's tokenizer.json")
        with self._lock:
            if self._tokenizer is None:
                eos = list(self.eos_token_ids) or None
                self._tokenizer = llguidance.LLTokenizer(self.tokenizer_json, n_vocab=self.vocab_size, eos_token=eos)
            return self._tokenizer

    def check(self, spec, prefix: str = "sampling.structured_output"):
        """The compiled matcher of `spec` in its initial state (compiled once, the `MAX_GRAMMARS` most
        recent kept); a ConfigError naming the field for what cannot compile."""
        validate_spec(spec, prefix)
        key = json.dumps(spec, sort_keys=True)
        with self._lock:
            if key in self._matchers:
                self._matchers.move_to_end(key)
                return self._matchers[key]
        tokenizer = self._ll_tokenizer()
        import llguidance

        grammar = grammar_text(spec, prefix)
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error and not error.startswith("WARNING"):
            raise ConfigError(f"{prefix}.{next(iter(spec))}: cannot compile: {error}")
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise ConfigError(f"{prefix}.{next(iter(spec))}: cannot compile: {matcher.get_error()}")
        with self._lock:
            self._matchers[key] = matcher
            while len(self._matchers) > MAX_GRAMMARS:
                self._matchers.popitem(last=False)
        return matcher

    def matcher(self, spec, prefix: str = "sampling.structured_output"):
        """A fresh GrammarMatcher for one request (a copy of the compiled one)."""
        from eyas.engine.structured.matcher import GrammarMatcher

        return GrammarMatcher(self.check(spec, prefix).deep_copy(), self.vocab_size)
