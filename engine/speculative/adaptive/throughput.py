"""The `throughput` policy: choose the candidate with the highest estimated tokens per second.

Per tier, from measured figures only. For a chain of k steps the expected tokens per request per
cycle, 1 + E[accepted drafts | k], comes from the shared acceptance model (`acceptance.py`: every
chain cycle informs every depth); for a tree shape or another drafter, from the accepted drafts of
its own cycles (a tree's acceptance is not a chain's at any depth, nor is n-gram lookup's), averaged
by a `SettlingAverage` of weight `OWN_ALPHA`. The seconds per cycle at the current batch size come
from the tier's cost model (`cycle_cost.py`: one line in k fitted from every measured chain k; each
other candidate on its own; the draft-extend that catches the head up on cycles it sat out, at 0
steps or while another drafter drafted, is a cost of switching back and stays out of it). Estimated
rate = expected tokens / seconds. A cycle's seconds are its phases' and the host's time since the
previous cycle (`HOST_PHASE`): a cost every cycle pays alike, which short chains pay most often per token.

It first runs `update_interval` cycles at each candidate (the initial one, then chains outwards from its step
count, then tree shapes and other drafters, each of those until its estimate stands), skipping one that the
measurements so far already estimate more than `PROBE_MARGIN` below the best (so a costly deep k need not be
tried), then every `update_interval` cycles takes the best estimate (when it beats the current best's by more
than `SWITCH_MARGIN`: estimates within that of each other are noise on this machine; where the tier lists 0
steps, a drafting candidate must beat its estimate by `PLAIN_MARGIN`, else 0 steps is the best, and one that did
not run in the interval just ended first runs an interval at 0 steps' expense to confirm it on this machine's
speed now). Every
`probe_interval` updates it spends one interval on a probe, in turn: the chain above the best, the chain below
it (when the best is not a chain: the best chain), then each other candidate, then 0 steps where the tier
lists it; 0 steps is also probed first, whatever its estimate and its turn, while its cost at the current
batch size is only scaled from another one, and once it has not run for `STALE_OTHER_UPDATES` updates (see
`_probe`). A probe estimated more than `PROBE_MARGIN` below the best, or, at 0 steps, any drafting candidate
not estimated to beat it by `PLAIN_MARGIN`, is skipped for the next in turn; when all are, the one that has waited longest runs once
it has not run for `STALE_UPDATES` updates (an estimate from a few cycles of bursty acceptance, n-gram
lookup's above all, must not rule a candidate out for good; a tree's or another drafter's sooner, and its
estimate stands only after `MIN_OWN_CYCLES` cycles). A probe of a measured candidate runs only while the
seconds it would lose (an interval at its cycle time, at the rate it falls short of the best by, and the
catch-up of the draft head when the best does not run it) fit, with what every probe lost before, within
`PROBE_BUDGET` of the seconds run: at batch 8 a suffix probe of 8 steps cost 5.8 zero-step cycles at half
their rate, and stale probes every 25 updates spent 12% of the time there; at batch 32 probes of 1 and 2 steps
from 0, each after a catch-up over every token held since, spent 6%; at batch 8 a probe of 1 step estimated
within a tenth of 0 steps could run every probe interval, one in seven. Probes refresh the acceptance of a
deeper position, a neighbour's cost, or another candidate's acceptance on the current text. The state lives as
long as the engine: later `generate` calls start from what earlier ones measured.
"""

from eyas.engine.phase_clock import CATCH_UP_PHASE
from eyas.engine.speculative.adaptive.acceptance import AcceptanceModel
from eyas.engine.speculative.adaptive.cycle_cost import CycleCostModel
from eyas.engine.speculative.adaptive.settling_average import SettlingAverage
from eyas.engine.speculative.adaptive.tiers import chains_of, others_of
from eyas.engine.speculative.candidate import Candidate

PROBE_MARGIN = 0.1  # probe a candidate estimated at >= (1 - margin) x the best rate
SWITCH_MARGIN = 0.03  # a candidate becomes the best when estimated at > (1 + margin) x the best's rate
# ... and a drafting candidate only when estimated at > (1 + margin) x plain decoding's, where the tier lists 0
# steps: a rate per request leaves out the cost of requests drifting apart (a batch that speculates ends when
# its slowest request does), the head's catch-ups and its prefill extend
PLAIN_MARGIN = 0.1
# a tree's or another drafter's cycles differ more from one to the next than a chain's (n-gram lookup
# finds a long match or none): their acceptance and cost are averaged over more cycles
OWN_ALPHA = 0.05
STALE_UPDATES = 100  # ... or one that has not run for this many updates, whatever its estimate
# ... sooner for another drafter or a tree, whose acceptance only its own cycles measure: a suffix index
# fills as requests come, so a drafter that found nothing in its first cycles can be the best a few requests later
STALE_OTHER_UPDATES = 25
# ... and only while what such probes lose, all together, stays within this share of the time run (`_stale_probe_fits`)
PROBE_BUDGET = 0.02
# another drafter's or a tree's estimate stands once measured over this many cycles (before that: unmeasured,
# probed in turn): a first impression of two cycles, taken before any text repeated, must not rule it out
MIN_OWN_CYCLES = 6


class ThroughputPolicy:
    needs_timings = True

    def __init__(self, candidates: tuple[Candidate, ...], initial: Candidate, acceptance: AcceptanceModel,
                 ema_alpha: float, update_interval: int, probe_interval: int):
        self.candidates = candidates
        self.chains, self.others = chains_of(candidates), others_of(candidates)
        self.acceptance = acceptance
        self.alpha = ema_alpha
        self.own_alpha = min(ema_alpha, OWN_ALPHA)
        self.update_interval = update_interval
        self.probe_interval = probe_interval
        # initial first, then outwards, the nearer step count below first: two measured step counts >= 1
        # give the cost line, which estimates the rest before they are run; the others last
        middle = initial.num_steps
        self._explore = [initial] + sorted((c for c in self.chains if c != initial),
                                           key=lambda c: (abs(c.num_steps - middle), c.num_steps))
        # another drafter or a tree runs until its estimate stands (MIN_OWN_CYCLES), not a bare interval
        runs = -(-MIN_OWN_CYCLES // update_interval)
        self._explore += [c for c in self.others if c != initial for _ in range(runs)]
        self.index = candidates.index(initial)
        self._plain = next((c for c in self.chains if c.num_steps == 0), None)  # 0 steps, where the tier lists it
        self.best = initial
        self.costs = CycleCostModel(ema_alpha, self.own_alpha)
        self.own_accepted = SettlingAverage(self.own_alpha)  # others: accepted drafts per request per cycle
        self.batch_size = 1  # of the last cycle
        self.cycles = 0
        self.updates = 0
        self._probe_turn = 0
        self._last_run: dict[Candidate, int] = {}  # candidate -> `updates` when it last ran
        self.seconds_run = 0.0  # the cycles' seconds observed so far
        self.probe_loss_s = 0.0  # the seconds stale probes were estimated to lose, all together
        self.catch_up_s: float | None = None  # average seconds of a catch-up of the draft head (after it sat out)

    @property
    def choice(self) -> Candidate:
        return self.candidates[self.index]

    def observe(self, candidate: Candidate, accepted_drafts: list[int], timings: dict) -> None:
        if candidate.is_configured_chain:
            self.acceptance.observe(candidate.num_steps, accepted_drafts)
        elif accepted_drafts:
            self.own_accepted.add(candidate, sum(accepted_drafts) / len(accepted_drafts))
        self.batch_size = max(len(accepted_drafts), 1)
        self._last_run[candidate] = self.updates
        # catching the head up on cycles it sat out is a cost of switching, not of this candidate
        seconds = sum(t for phase, t in timings.items() if phase != CATCH_UP_PHASE)
        self.seconds_run += seconds + timings.get(CATCH_UP_PHASE, 0.0)
        caught_up = timings.get(CATCH_UP_PHASE, 0.0)
        if caught_up > 0 and candidate.num_steps > 0:  # a draft over held work ran (a lap at 0 steps times nothing)
            self.catch_up_s = caught_up if self.catch_up_s is None else \
                self.alpha * caught_up + (1 - self.alpha) * self.catch_up_s
        self.costs.observe(candidate, self.batch_size, seconds)
        self.cycles += 1
        if self.cycles % self.update_interval == 0:
            self._update()

    def cycle_seconds(self, candidate: Candidate, batch_size: int) -> float | None:
        return self.costs.seconds(candidate, batch_size)

    def estimated_rates(self) -> dict[Candidate, float | None]:
        """Tokens per request per second of every candidate at the current batch size (None: unmeasured)."""
        deepest = max((c.num_steps for c in self.chains), default=0)
        expected = self.acceptance.expected_accepted(deepest)  # [k]: accepted drafts at k steps
        out = {}
        for c in self.candidates:
            t = self.cycle_seconds(c, self.batch_size)
            if c.is_configured_chain:
                k = c.num_steps
                accepted = 0.0 if k == 0 else expected[k] if expected is not None else None  # 0 steps drafts nothing
            else:
                measured = self.own_accepted.counts.get(c, 0) >= MIN_OWN_CYCLES
                accepted = self.own_accepted.get(c) if measured else None
            out[c] = (1.0 + accepted) / t if accepted is not None and t is not None and t > 0 else None
        return out

    def _update(self) -> None:
        if self._explore:
            self._explore.pop(0)
            while self._explore and self._not_worth_exploring(self._explore[0]):
                self._explore.pop(0)
            if self._explore:
                self.index = self.candidates.index(self._explore[0])
                return
        self.updates += 1
        rates = self.estimated_rates()
        known = {c: r for c, r in rates.items() if r is not None}
        confirm = None
        if known:
            leader, before = max(known, key=known.get), self.best
            # the best changes hands only to a clear leader: cycle times here vary by a third from one
            # cycle to the next, and each switch to a slower candidate costs its interval
            if known.get(self.best) is None or known[leader] > (1 + SWITCH_MARGIN) * known[self.best]:
                self.best = leader
            # speculating must beat plain decoding clearly (PLAIN_MARGIN): a tie within the noise is a loss
            plain = self._plain
            if plain in known and self.best != plain and known[self.best] <= (1 + PLAIN_MARGIN) * known[plain]:
                self.best = plain
            elif before == plain and self.best != plain and not self._fresh(self.best):
                # leaving 0 steps on an estimate measured before 0 steps' fresh ones is a comparison across
                # this machine's drifts (at batch 8 a slow spell raised 0 steps' cost from 21 to 33 ms a cycle
                # while 1 step's stood at 42 from a faster one, and 1 and 2 steps took over): run it an
                # interval first, and it takes over only if its fresh estimate still beats 0 steps
                confirm, self.best = self.best, plain
        choice = confirm or self.best
        if confirm is None and self.probe_interval and self.updates % self.probe_interval == 0:
            choice = self._probe(rates) or self.best
        self.index = self.candidates.index(choice)

    def _fresh(self, candidate: Candidate) -> bool:
        """Whether the candidate ran in the interval just ended: its estimate stands on this machine's speed now."""
        return self._last_run.get(candidate, -2) >= self.updates - 1

    def _not_worth_exploring(self, candidate: Candidate) -> bool:
        """Already estimated (from the cost line and the acceptance of other step counts) far below the
        best estimate: running it would cost more than it could tell."""
        rates = self.estimated_rates()
        known = [r for r in rates.values() if r is not None]
        return rates[candidate] is not None and rates[candidate] < (1 - PROBE_MARGIN) * max(known)

    def _probe_order(self, rates: dict) -> list[Candidate]:
        """The candidates a probe may take, in turn: chain neighbours of the best, then the others."""
        if not self.best.is_configured_chain:
            chains = [c for c in self.chains if rates[c] is not None]
            neighbours = [max(chains, key=rates.get)] if chains else list(self.chains[:1])
        else:
            i = self.chains.index(self.best)
            neighbours = self.chains[i + 1:i + 2] + self.chains[max(i - 1, 0):i]  # above, then below
        order = list(neighbours) + [c for c in self.others if c != self.best]
        plain = self._plain
        if plain is not None and plain != self.best and plain not in order:
            order.append(plain)  # plain decoding, which never loses: its estimate must not go stale (`_probe`)
        return order

    def _probe(self, rates: dict) -> Candidate | None:
        """The next candidate in turn worth an interval (unmeasured, or estimated close to the best and paid
        for); else the one below the floor that has waited longest, once stale and paid for (one queue: a
        costly probe, a chain's after a long catch-up, is not starved by cheaper ones spending the budget first)."""
        order = self._probe_order(rates)
        if not order:
            return None
        plain = self._plain
        if plain in order and (not self.costs.measured_at(plain, self.batch_size)
                               or (self._stale(plain) and self._probe_fits(plain, rates))):
            # plain decoding's estimate is refreshed whatever the turn: one scaled from another batch size or
            # left stale could keep a losing candidate the best for long (at batch 8, 0 steps measured only at
            # 2 was estimated at 46 ms a cycle against 20 measured; at 32 two stalls of this machine in its
            # last cycles raised it from 59 to 88 ms; in both a chain that lost to it stayed the best)
            return plain
        start = self._probe_turn % len(order)
        self._probe_turn += 1
        floor = (1 - PROBE_MARGIN) * (rates[self.best] or 0.0)
        for c in order[start:] + order[:start]:
            if rates[c] is None or (rates[c] >= floor and self._close_probe_pays(c, rates)
                                    and self._probe_fits(c, rates)):
                return c
        due = min(order, key=lambda c: self._last_run.get(c, -1))
        return due if self._stale(due) and self._probe_fits(due, rates) else None

    def _close_probe_pays(self, candidate: Candidate, rates: dict) -> bool:
        """At 0 steps, a drafting candidate not estimated to beat it by `PLAIN_MARGIN` is probed only once stale:
        its probe could not make it the best, and each starts with a catch-up and leaves the batch's requests
        apart (at batch 8, aot, SmolLM2, in one process: the default's drafting cycles were 12% of all, and it
        made 0.92x plain where 0 steps alone made 1.01x; with the bar at 0 steps' own estimate, 1 step within
        a few percent of it either way was still probed every few probe intervals)."""
        return self.best != self._plain or rates[candidate] > (1 + PLAIN_MARGIN) * rates[self.best]

    def _stale(self, candidate: Candidate) -> bool:
        """Not run for its stale updates: a step count's 100, another drafter's, a tree's and 0 steps' 25."""
        after = STALE_OTHER_UPDATES if candidate == self._plain or not candidate.is_configured_chain else STALE_UPDATES
        return self.updates - self._last_run.get(candidate, -after) >= after

    def _probe_fits(self, candidate: Candidate, rates: dict) -> bool:
        """Whether the seconds the probe would lose (an interval at its cycle time, at the rate it falls short
        of the best by, and the head's catch-up when the best does not draft with it) fit, with every probe's
        before, within `PROBE_BUDGET` of the seconds run (then they are counted as lost)."""
        seconds, best = self.cycle_seconds(candidate, self.batch_size), rates[self.best]
        if seconds is None or not best:
            return True
        loss = self.update_interval * seconds * max(1 - rates[candidate] / best, 0.0)
        if _drafts_with_head(candidate) and not _drafts_with_head(self.best):
            loss += self.catch_up_s or 0.0  # the head catches up on every token held since it last drafted
        if self.probe_loss_s + loss > PROBE_BUDGET * self.seconds_run:
            return False
        self.probe_loss_s += loss
        return True


def _drafts_with_head(candidate: Candidate) -> bool:
    """Whether the configured drafter drafts (a chain or tree of >= 1 step): its head is then caught up first."""
    return candidate.drafter is None and candidate.num_steps > 0
