"""Seconds per decode cycle as a function of the candidate and the batch size b, from measurements.

Per batch size: a moving average of the cycle time of each candidate measured there. For a chain or 0 steps, whose
cycles do the same work each time, a measurement more than `OUTLIER` times the average is a stall of this machine,
not a cost of the candidate: it is left out, and only a second in a row is taken in (clipped there: the machine's
speed changed). A tree shape's or another drafter's cycle is never left out nor clipped: another drafter's cycle
that drafts nothing verifies a token per request, the next may verify num_steps + 1, five times the cost at batch 8.
A chain cycle at k >= 1 steps drafts k tokens and verifies k + 1, so its cost grows about linearly in k: the slope comes
from a least-squares line through the averages of every k measured at that batch size, and the level from the
k measured most recently. So one line serves every k: a k not run lately (or ever, once two others were) is
estimated from the fresh level, and a drift of this machine's speed moves every k alike. A cycle at k = 0
(plain decoding) drafts nothing: it is averaged on its own with the chains' weight (its cost is as steady as
theirs, and it runs mostly in probes, so a slower average would keep a cost from the machine's first, slow
cycles and favour speculating). A chain or 0 steps back after `RESTART_AFTER` cycles away starts its average
afresh: estimates compared across this machine's drifts (a slow spell raised 0 steps' cost at batch 8 from 21
to 33 ms a cycle while 1 step's stood at 42 from a faster one) make the one that runs look worse. A tree shape or
another drafter drafts and verifies on its own pattern, with cycles that differ more from one to the next:
each is averaged on its own (a `SettlingAverage` of weight `own_alpha`). At a batch size not measured (for
that candidate, or for any chain k >= 1 on the line), the nearest one that was is scaled in proportion.
"""

from eyas.engine.speculative.adaptive.settling_average import SettlingAverage

OUTLIER = 2.0
# a chain or 0 steps back after sitting out this many cycles (at any batch size) starts its average afresh: what
# it measured before, at another of this machine's speeds, says less than its first cycle now
RESTART_AFTER = 20
LINE = "line"  # the family of chain step counts >= 1


def _family(candidate):
    """Candidates whose measurements inform each other: every configured chain k >= 1; anything else alone."""
    return LINE if candidate.is_configured_chain and candidate.num_steps > 0 else candidate


def _is_plain(candidate) -> bool:
    return candidate.is_configured_chain and candidate.num_steps == 0


class CycleCostModel:
    def __init__(self, ema_alpha: float, own_alpha: float | None = None):
        self.alpha = ema_alpha
        self._own = SettlingAverage(ema_alpha if own_alpha is None else own_alpha)  # candidates averaged on their own
        self.mean: dict[tuple, float] = {}  # (candidate, b) -> seconds per cycle
        self.latest: dict = {}  # b -> the chain (k >= 1) measured last at b
        self._slopes: dict[int, float | None] = {}  # b -> fitted seconds per step (cleared by new measurements)
        self.cycles = 0
        self._seen: dict = {}  # a chain or 0 steps -> the cycle it last ran at (any batch size)
        self._stalled: set = set()  # (candidate, b) whose last measurement was left out as a stall

    def observe(self, candidate, batch_size: int, seconds: float) -> None:
        key = (candidate, batch_size)
        self.cycles += 1
        if _family(candidate) != LINE and not _is_plain(candidate):
            # unclipped: clipped at twice its average, suffix decoding's estimate at batch 8 (SmolLM2, aot, chat
            # prompts) rose only from 19 ms a cycle (a first cycle that matched nothing) to 42 ms over three waves
            # of probes while its cycles there took 90 ms on average, and it kept being probed and chosen
            self.mean[key] = self._own.add(key, seconds)
            return
        old = self.mean.get(key)
        if old is not None and seconds > OUTLIER * old and key not in self._stalled:
            # left out: at batch 32 (SmolLM2, aot) a zero-step cycle of 346 ms among ones of 65, clipped, raised 0
            # steps' estimate by a quarter, and 1 step became the best until 0 steps was probed again (plain
            # decoding's own steps stall alike on this machine)
            self._stalled.add(key)
            return
        self._stalled.discard(key)
        seen = self._seen.get(candidate)
        if seen is not None and self.cycles - seen > RESTART_AFTER:
            old = None
        self._seen[candidate] = self.cycles
        if old is None:
            self.mean[key] = seconds
        else:
            self.mean[key] = self.alpha * min(seconds, OUTLIER * old) + (1 - self.alpha) * old
        if _family(candidate) == LINE:
            self.latest[batch_size] = candidate
            self._slopes.pop(batch_size, None)

    def seconds(self, candidate, batch_size: int) -> float | None:
        """Estimated seconds per cycle of `candidate` at this batch size, or None while nothing supports it."""
        family = _family(candidate)
        sizes = sorted({b for c, b in self.mean if _family(c) == family}, key=lambda b: (abs(b - batch_size), b))
        for b in sizes:  # the nearest batch size that supports an estimate
            t = self._at(candidate, b)
            if t is not None:
                return t * batch_size / b
        return None

    def measured_at(self, candidate, batch_size: int) -> bool:
        """Whether `seconds(candidate, batch_size)` stands on a measurement at that batch size (a chain: any
        k >= 1 measured there), not on one scaled from another (in proportion: too dear scaled up where a
        cycle's cost is mostly fixed, too cheap scaled down)."""
        if _family(candidate) != LINE:
            return (candidate, batch_size) in self.mean
        return any(b == batch_size and _family(c) == LINE for c, b in self.mean)

    def _at(self, candidate, b: int) -> float | None:
        if _family(candidate) != LINE:
            return self.mean.get((candidate, b))
        slope = self._slope(b)
        if slope is None:
            return self.mean.get((candidate, b))
        ref = self.latest[b]
        return max(self.mean[(ref, b)] + slope * (candidate.num_steps - ref.num_steps), 1e-9)

    def _slope(self, b: int) -> float | None:
        """Least-squares seconds per step through the averages of every k >= 1 measured at b (>= 0)."""
        if b not in self._slopes:
            points = [(c.num_steps, t) for (c, bb), t in self.mean.items() if bb == b and _family(c) == LINE]
            if len(points) < 2:
                self._slopes[b] = None
            else:
                mean_k = sum(k for k, _ in points) / len(points)
                mean_t = sum(t for _, t in points) / len(points)
                slope = (sum((k - mean_k) * (t - mean_t) for k, t in points)
                         / sum((k - mean_k) ** 2 for k, _ in points))
                self._slopes[b] = max(slope, 0.0)
        return self._slopes[b]
