"""Speculative-decoding figures. tau (`mean_accept_length`) = tokens emitted per verify cycle, bonus
included (1 <= tau <= k + 1). A cycle's proposed drafts are the draft positions its tree reaches (a
chain: its drafts; a tree: its deepest node's depth), the same meaning for chains and trees.
Per-position acceptance rate is unconditional: cycles in which draft position i was accepted / cycles.
Draft acceptance rate = accepted drafts / proposed drafts."""

from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    num_verify_cycles: int = 0
    num_emitted: int = 0  # accept lengths summed (bonus included)
    num_proposed: int = 0
    num_accepted: int = 0
    position_accepts: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, accept_len: int) -> None:
        self.num_verify_cycles += 1
        self.num_emitted += accept_len
        self.num_proposed += num_drafts
        self.num_accepted += accept_len - 1
        if len(self.position_accepts) < num_drafts:
            self.position_accepts.extend([0] * (num_drafts - len(self.position_accepts)))
        for i in range(accept_len - 1):
            self.position_accepts[i] += 1

    def as_dict(self) -> dict:
        cycles = max(self.num_verify_cycles, 1)
        return {
            "mean_accept_length": self.num_emitted / cycles if self.num_verify_cycles else 0.0,
            "accept_rate_per_position": [a / cycles for a in self.position_accepts],
            "draft_accept_rate": self.num_accepted / self.num_proposed if self.num_proposed else 0.0,
            "num_verify_cycles": self.num_verify_cycles,
        }
