"""The parts drafters are built from (`registry.DrafterParts`): config values, and the draft head and
other drafters built on first request, each once."""

from collections.abc import Callable

from eyas.engine.speculative.drafters.registry import drafter_class


class ContainerDrafterParts:
    def __init__(self, algorithm: str, spec, max_branches: int, lookups: set[str], head: Callable):
        self.algorithm, self.spec, self.max_branches, self.lookups = algorithm, spec, max_branches, lookups
        self._head = head  # the container's DraftHead provider: the draft model loads when it is first called
        self._built: dict[str, object] = {}

    def head(self):
        return self._head()

    def drafter(self, name: str):
        if name not in self._built:
            self._built[name] = drafter_class(name).from_parts(self)
        return self._built[name]
