"""The replicas' Prometheus metrics gathered for the ingress's `/metrics`.

Each replica posts its server's exposition to the board (a Ray actor) every few seconds; the ingress reads
the board and merges the texts with a `replica` label on every sample (`merge_expositions`). A replica that
stopped posting (dead, or replaced by a restart) drops out after `stale_s`.
"""

import re
import time

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")


class MetricsBoard:
    """Plain class; `deployments` runs it as a named Ray actor."""

    def __init__(self, stale_s: float = 6.0):
        self.stale_s = stale_s
        self.posts: dict[str, tuple[float, str, dict]] = {}  # replica -> (time, exposition, info)

    def post(self, replica: str, exposition: str, info: dict) -> None:
        self.posts[replica] = (time.monotonic(), exposition, info)

    def read(self) -> dict[str, tuple[str, dict]]:
        now = time.monotonic()
        for replica in [r for r, (t, _, _) in self.posts.items() if now - t > self.stale_s]:
            del self.posts[replica]
        return {replica: (text, info) for replica, (_, text, info) in self.posts.items()}


def merge_expositions(texts: dict[str, str]) -> str:
    """Prometheus text expositions of several replicas as one: each family's HELP / TYPE once, then every
    replica's samples of it with `replica="<id>"` added to their labels."""
    families: dict[str, dict] = {}
    for replica, text in sorted(texts.items()):
        family = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split()[2]
                family = families.setdefault(name, {"comments": {}, "samples": []})
                family["comments"].setdefault(line.split()[1], line)
                continue
            match = SAMPLE.match(line)
            if match is None or family is None:
                continue
            name, labels, rest = match.groups()
            inner = labels[1:-1] if labels else ""
            label = f'replica="{replica}"' + (f",{inner}" if inner else "")
            family["samples"].append(f"{name}{{{label}}}{rest}")
    lines = []
    for family in families.values():
        lines += [family["comments"][kind] for kind in ("HELP", "TYPE") if kind in family["comments"]]
        lines += family["samples"]
    return "\n".join(lines) + "\n" if lines else ""
