"""Speculative vs plain decoding on held-out standard-library prompts, with the shipped pair.

    python scripts/bench_spec.py                          # EAGLE-3, k = 1..6, T=0, batch 1, 20 prompts x 128 tokens
    python scripts/bench_spec.py --kind eagle --ks 2,4 --temperature 1.0

For each k, in one run: tau (tokens per verify cycle, bonus included), per-position acceptance
(unconditional: accepted at position i / cycles), plain and speculative tokens/s and the speedup;
the measured costs of a target decode step, a verify forward (k+1 tokens), one draft step and one
draft-extend; the ideal speedup tau * t_decode / (t_verify + k * t_draft + t_extend), and the
efficiency = measured speedup / ideal. Times are wall-clock means over the decode phase (prefill
excluded), measured in this run on this machine.
"""

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import heldout_prompts  # noqa: E402

from engine import SamplingParams, build_engine  # noqa: E402


class PhaseTimer:
    """Wraps bound methods of the engine's workers to accumulate wall time per (phase, name)."""

    def __init__(self):
        self.total = defaultdict(float)
        self.count = defaultdict(int)
        self.phase = "decode"

    def wrap(self, obj, name: str, label: str, set_phase: str | None = None, phase_of=None):
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            previous = self.phase
            if set_phase:
                self.phase = set_phase
            elif phase_of is not None:
                self.phase = phase_of(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.total[(self.phase, label)] += time.perf_counter() - start
                self.count[(self.phase, label)] += 1
                self.phase = previous

        setattr(obj, name, timed)

    def mean(self, label: str, phase: str = "decode") -> float:
        n = self.count[(phase, label)]
        return self.total[(phase, label)] / n if n else float("nan")


def run(engine, prompts: list[str], params: SamplingParams, batch_size: int) -> tuple[float, int]:
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch_size):
        tokens += sum(len(o.token_ids) for o in engine.generate(prompts[i:i + batch_size], params))
    return time.perf_counter() - start, tokens


def plain(args, prompts, params):
    with build_engine(["speculative=none", "draft=none", *args.override]) as eng:
        timer = PhaseTimer()
        # a forward whose requests all extend by one token is a decode step; others carry a prefill
        timer.wrap(eng.worker.runner, "forward", "target_forward",
                   phase_of=lambda batch, *a, **kw: "decode" if max(batch.extend_lens) == 1 else "prefill")
        run(eng, prompts[:2], params, args.batch_size)  # warmup
        timer.total.clear(), timer.count.clear()
        seconds, tokens = run(eng, prompts, params, args.batch_size)
    return tokens / seconds, timer.mean("target_forward")


def speculative(args, prompts, params, k):
    overrides = [f"speculative={args.kind}", f"draft={args.kind}", f"speculative.num_steps={k}",
                 f"speculative.num_draft_tokens={k + 1}", *args.override]
    with build_engine(overrides) as eng:
        timer = PhaseTimer()
        worker, draft = eng.worker, eng.worker.draft_worker
        timer.wrap(worker, "prefill", "prefill", set_phase="prefill")
        timer.wrap(worker.target_runner, "forward", "verify")
        timer.wrap(draft, "draft", "draft")
        timer.wrap(draft, "forward_draft_extend", "extend")
        timer.wrap(draft.draft_runner, "forward", "draft_forward")
        run(eng, prompts[:2], params, args.batch_size)
        timer.total.clear(), timer.count.clear()
        base = eng.metrics()
        seconds, tokens = run(eng, prompts, params, args.batch_size)
        metrics = eng.metrics()
    cycles = metrics["num_verify_cycles"] - base["num_verify_cycles"]
    emitted = metrics["mean_accept_length"] * metrics["num_verify_cycles"] - base["mean_accept_length"] * base["num_verify_cycles"]
    tau = emitted / cycles
    positions = [(a * metrics["num_verify_cycles"] - b * base["num_verify_cycles"]) / cycles
                 for a, b in zip(metrics["accept_rate_per_position"], base["accept_rate_per_position"] or [0] * k)]
    # the draft forward label also counts draft-extend forwards: take the step forwards only
    draft_forwards = timer.count[("decode", "draft_forward")] - timer.count[("decode", "extend")]
    draft_forward_time = timer.total[("decode", "draft_forward")] - timer.total[("decode", "extend")]
    return {
        "k": k, "tau": tau, "accept_per_position": positions, "tokens_per_s": tokens / seconds,
        "t_verify": timer.mean("verify"), "t_extend": timer.mean("extend"),
        "t_draft": timer.mean("draft") / k,  # draft phase per cycle / k (k proposals, k - 1 forwards)
        "t_draft_forward": draft_forward_time / draft_forwards if draft_forwards else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="eagle3", choices=["eagle", "eagle3"])
    p.add_argument("--ks", default="1,2,3,4,5,6")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("override", nargs="*", help="extra config overrides, e.g. model.path=/ckpt")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = heldout_prompts(args.num_prompts)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=0, ignore_eos=True)
    plain_tps, t_decode = plain(args, prompts, params)
    rows = [speculative(args, prompts, params, int(k)) for k in args.ks.split(",")]
    print(f"{args.kind}, {len(prompts)} held-out prompts x {args.max_new_tokens} new tokens, T={args.temperature}, "
          f"batch {args.batch_size}; plain decoding {plain_tps:.1f} tok/s, target decode step {t_decode * 1e3:.2f} ms")
    print("tau: tokens per verify cycle (bonus included); acceptance per position: accepted at i / cycles")
    header = (f"{'k':>2} {'tau':>5} {'spec tok/s':>10} {'speedup':>7} {'t_verify':>8} {'t_draft':>7} "
              f"{'t_extend':>8} {'ideal':>6} {'effic.':>6}  acceptance per position")
    print(header)
    for r in rows:
        ideal = r["tau"] * t_decode / (r["t_verify"] + r["k"] * r["t_draft"] + r["t_extend"])
        r.update(speedup=r["tokens_per_s"] / plain_tps, ideal_speedup=ideal)
        r["efficiency"] = r["speedup"] / ideal
        print(f"{r['k']:>2} {r['tau']:>5.2f} {r['tokens_per_s']:>10.1f} {r['speedup']:>6.2f}x "
              f"{r['t_verify'] * 1e3:>6.2f}ms {r['t_draft'] * 1e3:>5.2f}ms {r['t_extend'] * 1e3:>6.2f}ms "
              f"{ideal:>5.2f}x {r['efficiency']:>6.2f}  " + " ".join(f"{a:.2f}" for a in r["accept_per_position"]))
    step = [r["t_draft_forward"] for r in rows if r["t_draft_forward"] == r["t_draft_forward"]]
    if step:
        print(f"one draft forward step: {sum(step) / len(step) * 1e3:.2f} ms = "
              f"{sum(step) / len(step) / t_decode:.3f} of a target decode step (times in ms, means over the decode phase)")
    if args.json:
        args.json.write_text(json.dumps({"plain_tokens_per_s": plain_tps, "t_decode": t_decode, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
