"""SettlingAverage: per key, the plain mean of the first 1 / alpha values, then an exponential moving
average of weight alpha. No first value outweighs the ones after it, which matters for a quantity
that jumps from one cycle to the next (n-gram lookup finds a long match or none)."""


class SettlingAverage:
    def __init__(self, alpha: float):
        self.alpha = alpha
        self.values: dict = {}
        self.counts: dict = {}

    def add(self, key, x: float) -> float:
        n = self.counts[key] = self.counts.get(key, 0) + 1
        weight = max(self.alpha, 1.0 / n)
        self.values[key] = x if n == 1 else weight * x + (1 - weight) * self.values[key]
        return self.values[key]

    def get(self, key, default=None):
        return self.values.get(key, default)

    def __getitem__(self, key) -> float:
        return self.values[key]
