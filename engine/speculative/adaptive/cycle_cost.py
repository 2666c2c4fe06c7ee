"""Seconds per decode cycle as a function of the step count k and the batch size b, from measurements.

Per batch size: a moving average of the cycle time at each k measured there (a measurement more than
`OUTLIER` times the average is clipped: a stall of this machine, not a cost of k). A cycle at k >= 1
drafts k tokens and verifies k + 1, so its cost grows about linearly in k: the slope comes from a
least-squares line through the averages of every k measured at that batch size, and the level from
the k measured most recently. So one line serves every k: a k not run lately (or ever, once two
others were) is estimated from the fresh level, and a drift of this machine's speed moves every k
alike. A cycle at k = 0 (plain decoding) drafts nothing and is averaged on its own. At a batch size
not measured (at k), the nearest one that was is scaled in proportion.
"""

OUTLIER = 2.0


class CycleCostModel:
    def __init__(self, ema_alpha: float):
        self.alpha = ema_alpha
        self.mean: dict[tuple[int, int], float] = {}  # (k, b) -> seconds per cycle
        self.latest: dict[int, int] = {}  # b -> the k >= 1 measured last at b
        self._slopes: dict[int, float | None] = {}  # b -> fitted seconds per step (cleared by new measurements)

    def observe(self, k: int, batch_size: int, seconds: float) -> None:
        key = (k, batch_size)
        old = self.mean.get(key)
        if old is None:
            self.mean[key] = seconds
        else:
            self.mean[key] = self.alpha * min(seconds, OUTLIER * old) + (1 - self.alpha) * old
        if k > 0:
            self.latest[batch_size] = k
            self._slopes.pop(batch_size, None)

    def seconds(self, k: int, batch_size: int) -> float | None:
        """Estimated seconds per cycle at k and this batch size, or None while nothing supports it."""
        sizes = sorted({b for kk, b in self.mean if (kk == 0) == (k == 0)}, key=lambda b: (abs(b - batch_size), b))
        for b in sizes:  # the nearest batch size that supports an estimate at k
            t = self._at(k, b)
            if t is not None:
                return t * batch_size / b
        return None

    def _at(self, k: int, b: int) -> float | None:
        if k == 0:
            return self.mean.get((0, b))
        slope = self._slope(b)
        if slope is None:
            return self.mean.get((k, b))
        ref = self.latest[b]
        return max(self.mean[(ref, b)] + slope * (k - ref), 1e-9)

    def _slope(self, b: int) -> float | None:
        """Least-squares seconds per step through the averages of every k >= 1 measured at b (>= 0)."""
        if b not in self._slopes:
            points = [(kk, t) for (kk, bb), t in self.mean.items() if bb == b and kk > 0]
            if len(points) < 2:
                self._slopes[b] = None
            else:
                mean_k = sum(kk for kk, _ in points) / len(points)
                mean_t = sum(t for _, t in points) / len(points)
                slope = (sum((kk - mean_k) * (t - mean_t) for kk, t in points)
                         / sum((kk - mean_k) ** 2 for kk, _ in points))
                self._slopes[b] = max(slope, 0.0)
        return self._slopes[b]
