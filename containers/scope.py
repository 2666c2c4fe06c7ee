"""A scoped provider override: the context candidate runtime states are built in.

Entering a `ProviderScope` records, for every provider it overrides, that provider's override depth,
records which tracked singletons are already built, and snapshots the live bindings; then it pushes
its overrides. Leaving it, by normal exit or by exception, pops each provider back to its recorded
depth (dependency-injector's own `with provider.override(...)` pops the top of the stack, which is
not necessarily its own entry), resets every tracked singleton built inside, and restores the
bindings. Scopes nest: leaving a scope first leaves every scope of the same key opened after it, so
any order of exit ends with everything as it was before the outermost one.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dependency_injector import providers


class BuildTrackingSingleton(providers.Singleton):
    """A Singleton that knows whether it holds an instance (`built`)."""

    built = False

    def _provide(self, args, kwargs):
        instance = super()._provide(args, kwargs)
        self.built = True
        return instance

    def reset(self):
        super().reset()
        self.built = False


@dataclass
class BindingGuard:
    snapshot: Callable[[], object]  # -> an opaque snapshot, or None when there is nothing live
    restore: Callable[[object], None]


class ProviderScope:
    _open: dict[int, list["ProviderScope"]] = {}  # id(key) -> open scopes, oldest first

    def __init__(self, overrides: dict, singletons: Iterable[BuildTrackingSingleton] = (),
                 bindings: BindingGuard | None = None, key: object = None):
        self.overrides = {p: v if isinstance(v, providers.Provider) else providers.Object(v) for p, v in overrides.items()}
        self.singletons = list(singletons)
        self.bindings = bindings
        self.key = id(key)
        self.depths: dict = {}
        self.built_before: set[int] = set()
        self.snapshot = None
        self.is_open = False

    @classmethod
    def open_for(cls, key: object) -> bool:
        """Whether a scope of `key` is open (a build under overrides is under way)."""
        return bool(cls._open.get(id(key)))

    def __enter__(self) -> "ProviderScope":
        if self.is_open:
            raise RuntimeError("this ProviderScope is already open")
        self.depths = {p: len(p.overridden) for p in self.overrides}
        self.built_before = {id(s) for s in self.singletons if s.built}
        self.snapshot = self.bindings.snapshot() if self.bindings is not None else None
        self.is_open = True
        self._open.setdefault(self.key, []).append(self)
        try:
            for provider, value in self.overrides.items():
                provider.override(value)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False  # exceptions propagate

    def close(self) -> None:
        """Leave this scope (and every scope of its key opened after it); a closed scope is a no-op."""
        if not self.is_open:
            return
        stack = self._open[self.key]
        while stack[-1] is not self:
            stack[-1]._restore()
        self._restore()

    def _restore(self) -> None:
        stack = self._open[self.key]
        stack.pop()
        if not stack:
            del self._open[self.key]
        self.is_open = False
        for provider, depth in self.depths.items():
            while len(provider.overridden) > depth:
                provider.reset_last_overriding()
        for singleton in self.singletons:
            if singleton.built and id(singleton) not in self.built_before:
                singleton.reset()
        if self.snapshot is not None:
            self.bindings.restore(self.snapshot)
