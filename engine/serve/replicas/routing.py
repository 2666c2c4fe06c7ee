"""Routing policies of the replicated server: which replica a request goes to, as ranks of replica ids.

Each policy sees the request's routing text and the replicas' loads (requests in flight, and of those the
ones waiting for their answer to start) and returns ranks: the router sends the request to the least loaded
replica of the first rank that has room, else of the next (Ray Serve's `RequestRouter` contract). No Ray
here: `ray_router` adapts a policy to Ray Serve.

- `prefix`: of the replicas within the load bound (`within_bound`), those that were sent the longest prefix
  of this text (or nearly as long: `NEAR_MATCH` of it) hold it, when the match covers at least
  `min_match_ratio` of the text: the one first sent it (its owner) takes it, else they take it in turn;
  with no such match the replicas within the bound take it in turn. A replica's KV cache keeps target and
  draft KV together, so a hit also keeps speculation warm. The owner rather than turns among holders: a
  request the bound sent elsewhere leaves a copy of its prompt there, and taking turns would keep both
  copies warm, each crowding its replica's cache (README, Replicas on Ray Serve). Turns, not the least
  loaded one, where no owner decides: requests that a step ends together come back together, and the least
  loaded replica would take them all and prefill them in one step again.
  The bound is on waiting requests (routed, no answer started yet) first: a new request's first token waits
  for the prefills queued ahead of it, and hardly for the requests decoding there (measured: ~10 ms more per
  request in flight, against 1-2 s for a request whose prompt the replica must prefill whole, which also
  stalls every request admitted in that step). Requests in flight bound it only past `max_load_ratio` times
  the least loaded replica's, where that one would idle (7 streams on one replica, none on the other):
  counted in flight alone, a replica whose batch is about to end looks loaded.
- `power_of_two`: the less loaded of two replicas drawn at random.
- `round_robin`: each replica in turn.
"""

import random
from collections import OrderedDict
from dataclasses import dataclass

from eyas.engine.serve.replicas.prefix_index import PrefixIndex

ROUTINGS = ("prefix", "power_of_two", "round_robin")
# a replica sent at least this share of the longest match holds the prefix as well (requests after one system
# prompt differ by a chunk or two of their questions; a longer conversation held elsewhere still wins)
NEAR_MATCH = 0.875


@dataclass
class Decision:
    ranks: list[list[str]]
    reason: str  # prefix | balance (a prefix held by replicas too loaded) | no_prefix | power_of_two | round_robin
    matched_chars: int = 0  # of the chosen replica (prefix routing)

    @property
    def first(self) -> str:
        return self.ranks[0][0]


class Policy:
    """Counts requests per replica, in flight and waiting (no answer started): a request counts on its first
    choice from the moment it is ranked (a burst of requests ranked before any lands sees the ones before it),
    moves if it lands on another replica (`routed`), stops waiting when its answer starts (`answering`) and
    stops counting when it completes. Subclasses rank (`choose`)."""

    def __init__(self, seed: int | None = None):
        self.inflight: dict[str, int] = {}
        self.waiting: dict[str, int] = {}
        self.random = random.Random(seed)

    def rank(self, text: str, replicas: list[str]) -> Decision:
        decision = self.choose(text, replicas)
        self._count(decision.first, +1, waiting=True)
        return decision

    def choose(self, text: str, replicas: list[str]) -> Decision:
        raise NotImplementedError

    def routed(self, text: str, replica: str, decision: Decision) -> None:
        """The request `decision` ranked landed on `replica`."""
        if replica != decision.first:
            self._count(decision.first, -1, waiting=True)
            self._count(replica, +1, waiting=True)

    def landed(self, replica: str) -> None:
        """A request this policy did not rank landed on `replica`."""
        self._count(replica, +1, waiting=True)

    def answering(self, replica: str) -> None:
        """A request on `replica` started answering (its first token, or all of a plain answer)."""
        self._count(replica, -1, inflight=False, waiting=True)

    def completed(self, replica: str, answered: bool = False) -> None:
        """A request on `replica` completed; `answered`: its `answering` was counted."""
        self._count(replica, -1, waiting=not answered)

    def _count(self, replica: str, step: int, inflight: bool = True, waiting: bool = False) -> None:
        for counts, on in ((self.inflight, inflight), (self.waiting, waiting)):
            if on:
                counts[replica] = max(0, counts.get(replica, 0) + step)

    def forget(self, replica: str) -> None:
        self.inflight.pop(replica, None)
        self.waiting.pop(replica, None)

    def load(self, replica: str) -> int:
        return self.inflight.get(replica, 0)

    def queue(self, replica: str) -> int:
        return self.waiting.get(replica, 0)

    def by_load(self, replicas: list[str]) -> list[str]:
        shuffled = self.random.sample(replicas, len(replicas))  # equals in random order
        return sorted(shuffled, key=self.load)

    @staticmethod
    def then_the_rest(first: str, ordered: list[str]) -> list[list[str]]:
        rest = [r for r in ordered if r != first]
        return [[first], rest] if rest else [[first]]


class PrefixPolicy(Policy):
    def __init__(self, min_match_ratio: float = 0.3, max_imbalance: int = 4, max_load_ratio: float = 3.0,
                 chunk_chars: int = 64, max_chunks: int = 65536, seed: int | None = None):
        super().__init__(seed)
        self.min_match_ratio, self.max_imbalance, self.max_load_ratio = min_match_ratio, max_imbalance, max_load_ratio
        self.index = PrefixIndex(chunk_chars, max_chunks)
        self.turns: dict[str, int] = {}  # replica -> when it was last chosen (a count of decisions)
        # chunk key -> the replica first sent it: of the replicas holding a prefix, its owner takes it, so that
        # the copy a spill made elsewhere goes cold there instead of crowding both caches
        self.owners: OrderedDict[bytes, str] = OrderedDict()
        self.decisions = 0

    def choose(self, text: str, replicas: list[str]) -> Decision:
        keys = self.index.keys(text)
        matched = self.index.matched_chars(keys)
        in_turn = sorted(self.by_load(replicas), key=lambda r: self.turns.get(r, -1))  # least recently chosen first
        within = self.within_bound(in_turn)
        enough = max(1, self.min_match_ratio * len(text.encode()))
        best = max((matched.get(r, 0) for r in within), default=0)
        if best >= enough:
            holders = [r for r in within if matched.get(r, 0) >= NEAR_MATCH * best]
            owner = self.owners.get(keys[min(matched[r] for r in holders) // self.index.chunk_chars - 1])
            chosen = owner if owner in holders else holders[0]
            reason = "prefix"
        else:
            chosen = within[0]
            reason = "balance" if any(matched.get(r, 0) >= enough for r in replicas) else "no_prefix"
        self.decisions += 1
        self.turns[chosen] = self.decisions
        # recorded now, not when the replica accepts it: the next request with this prefix, routed before
        # this one lands, follows it
        self.index.insert(chosen, keys)
        self.own(chosen, keys)
        return Decision(self.then_the_rest(chosen, self.by_load(replicas)), reason, matched.get(chosen, 0))

    def own(self, replica: str, keys: list[bytes]) -> None:
        """The first replica sent a chunk owns it until the index forgets it there (or the replica goes)."""
        for key in keys:
            if self.owners.setdefault(key, replica) == replica:
                self.owners.move_to_end(key)
        while len(self.owners) > self.index.max_chunks:
            self.owners.popitem(last=False)

    def within_bound(self, replicas: list[str]) -> list[str]:
        """Those not too loaded: waiting requests within `max_imbalance` of the fewest, and requests in flight
        within `max_imbalance` of the fewest or `max_load_ratio` times them; when none is both, the first."""
        least_waiting = min(self.queue(r) for r in replicas)
        least = min(self.load(r) for r in replicas)
        short_queue = [r for r in replicas if self.queue(r) - least_waiting <= self.max_imbalance]
        return [r for r in short_queue if self.load(r) - least <= self.max_imbalance
                or self.load(r) <= self.max_load_ratio * least] or short_queue

    def routed(self, text: str, replica: str, decision: Decision) -> None:
        super().routed(text, replica, decision)
        if replica != decision.first:  # where it went when the first choice had no room
            self.index.insert(replica, self.index.keys(text))

    def forget(self, replica: str) -> None:
        super().forget(replica)
        self.index.remove(replica)
        self.turns.pop(replica, None)
        for key in [k for k, owner in self.owners.items() if owner == replica]:
            del self.owners[key]


class PowerOfTwoPolicy(Policy):
    def choose(self, text: str, replicas: list[str]) -> Decision:
        pair = self.random.sample(replicas, min(2, len(replicas)))
        chosen = min(pair, key=self.load)
        return Decision(self.then_the_rest(chosen, self.by_load(replicas)), "power_of_two")


class RoundRobinPolicy(Policy):
    def __init__(self, seed: int | None = None):
        super().__init__(seed)
        self.turn = 0

    def choose(self, text: str, replicas: list[str]) -> Decision:
        ordered = sorted(replicas)
        chosen = ordered[self.turn % len(ordered)]
        self.turn += 1
        return Decision(self.then_the_rest(chosen, self.by_load(replicas)), "round_robin")


def make_policy(routing: str, **prefix_settings) -> Policy:
    if routing == "prefix":
        return PrefixPolicy(**prefix_settings)
    if routing == "power_of_two":
        return PowerOfTwoPolicy()
    if routing == "round_robin":
        return RoundRobinPolicy()
    raise ValueError(f"replicas.routing must be one of {list(ROUTINGS)}, got {routing!r}")
