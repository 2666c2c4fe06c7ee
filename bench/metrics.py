"""Figures of a run read from two `Engine.metrics()` snapshots, before and after it."""


def tau_between(before: dict, after: dict) -> float | None:
    """Tokens per verify cycle (bonus included) of the cycles between the snapshots; None without any
    (plain decoding, or no cycle run)."""
    if "num_verify_cycles" not in after:
        return None
    cycles = after["num_verify_cycles"] - before.get("num_verify_cycles", 0)
    if not cycles:
        return None
    emitted = (after["mean_accept_length"] * after["num_verify_cycles"]
               - before.get("mean_accept_length", 0.0) * before.get("num_verify_cycles", 0))
    return emitted / cycles
