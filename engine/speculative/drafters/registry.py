"""The drafters, one row each: what `speculative.algorithm` may name and what each drafter needs and can do.

The config schema, validation and resolution, adaptive candidates, the containers and the tests read
this table; none of them lists drafters. A new drafter is a row here and its own module: a class that
follows the `Drafter` protocol (`base.py`) and builds itself from `DrafterParts` in `from_parts`.
`speculative=<name>` and `draft=<name>` work without config files (see `launch/schema.py`); a
`conf/speculative/<name>.yaml` documents and tunes its fields.
"""

from dataclasses import dataclass
from importlib import import_module
from typing import Any, Protocol

from eyas.engine.models.draft_loader import DRAFT_MODELS  # noqa: F401  (the draft model kinds; "none": no draft model)

PLAIN = "none"  # speculative.algorithm of plain decoding: no drafter
HOST = "hybrid"  # the drafter built when adaptive tiers list other drafters: it drafts as each of them


@dataclass(frozen=True)
class DrafterRow:
    name: str  # speculative.algorithm
    builder: str  # "module:Class" under eyas.engine.speculative.drafters, imported when first built
    draft_kinds: tuple[str, ...] = (PLAIN,)  # draft.kind values it drafts with, its default first
    lookup: bool = False  # drafts from token indexes alone: the host can draft as it, and its rule with it
    hosts_others: bool = False  # adaptive tiers may list other drafters beside it (they share its head's state)
    fixed_depth: bool = False  # each draft's depth follows its own evidence: adaptive=auto leaves the step count
    lookup_field: str | None = None  # a speculative.* field naming the lookup its own rule drafts with
    default_steps: int = 3  # speculative.num_steps where no conf/speculative/<name>.yaml sets it

    @property
    def draft_model(self) -> bool:
        """Whether it runs a draft model (and so gets draft backends, a draft KV pool and draft graphs)."""
        return self.draft_kinds != (PLAIN,)


DRAFTERS = {row.name: row for row in (
    DrafterRow("eagle", "eagle:EagleDrafter", draft_kinds=("eagle",), hosts_others=True),
    DrafterRow("eagle3", "eagle:EagleDrafter", draft_kinds=("eagle3",), hosts_others=True),
    DrafterRow("ngram", "ngram:NgramDrafter", lookup=True, default_steps=5),
    DrafterRow("suffix", "suffix:SuffixDrafter", lookup=True, fixed_depth=True, default_steps=16),
    DrafterRow("standalone", "standalone:StandaloneDrafter", draft_kinds=("lm",)),
    DrafterRow("hybrid", "hybrid:HybridDrafter", draft_kinds=("eagle3", "eagle"), hosts_others=True,
               lookup_field="hybrid_lookup", default_steps=4),
)}

ALGORITHMS = (PLAIN, *DRAFTERS)  # speculative.algorithm's allowed values
LOOKUPS = tuple(name for name, row in DRAFTERS.items() if row.lookup)
# drafters an adaptive candidate may switch to ({drafter: name, ...}): the lookups, and the host's own rule
CANDIDATE_DRAFTERS = (*LOOKUPS, HOST)
HOSTS = tuple(name for name, row in DRAFTERS.items() if row.hosts_others)


def draft_kinds(algorithm: str) -> tuple[str, ...]:
    """The draft.kind values `algorithm` runs with (plain decoding: none)."""
    return DRAFTERS[algorithm].draft_kinds if algorithm in DRAFTERS else (PLAIN,)


def needs_draft_model(drafter: str) -> bool:
    return drafter in DRAFTERS and DRAFTERS[drafter].draft_model


def lookups_of(drafter: str, spec: dict) -> set[str]:
    """The lookups `drafter` drafts with under the speculative group `spec`."""
    row = DRAFTERS.get(drafter)
    if row is None:
        return set()
    if row.lookup:
        return {drafter}
    return {spec[row.lookup_field]} if row.lookup_field else set()


def grafts_lookup(drafter: str) -> bool:
    """Whether `drafter`'s trees carry its rule's lookup branches beside the head's nodes."""
    return drafter in DRAFTERS and DRAFTERS[drafter].lookup_field is not None


def fixed_depth(algorithm: str) -> bool:
    """Whether adaptive=auto leaves `algorithm`'s step count as set (plain decoding has none to adapt)."""
    return algorithm not in DRAFTERS or DRAFTERS[algorithm].fixed_depth


def drafter_class(name: str) -> type:
    """The class that drafts for `name` (its module is imported here, once it is needed)."""
    module, cls = DRAFTERS[name].builder.split(":")
    return getattr(import_module(f"{__package__}.{module}"), cls)


class DrafterParts(Protocol):
    """What a drafter's `from_parts` builds it from (the container supplies it; each part is built
    once, when first asked for)."""

    algorithm: str  # the configured speculative.algorithm
    spec: Any  # the speculative config group: its fields as attributes
    max_branches: int  # the most children per node of any shape the worker may run
    lookups: set[str]  # the lookups some candidate or rule drafts with

    def head(self):
        """The draft model's `DraftHead` (loads the draft model)."""

    def drafter(self, name: str):
        """Drafter `name`, built once and shared (the host holds the head's and the lookups')."""
