"""Adaptive speculation vs every fixed step count vs plain decoding, on a mixed workload.

    python -m eyas.bench adaptive                        # shipped EAGLE-3, batch sizes 1, 4, 16
    python -m eyas.bench adaptive --batch-sizes 4 --rounds 2 --max-new-tokens 96 --plot adaptive.png

The workload alternates predictable prompts (held-out standard-library code) with hard ones
(English prose, `prompts/natural_language.txt`). For a batch size B (`cache.max_running_requests`),
the prompts go in waves of 2 B: each wave is one `generate` call, so the batch is full for its first
half and drains in the second, passing through the smaller tiers. A batch size gets
max(--num-prompts, 8 B) prompts. `--alternate prompt` (the default) alternates them prompt by
prompt, so at batch > 1 every wave mixes code and prose and the mix is the same all along;
`--alternate wave` alternates code waves and prose waves, so the text changes in time at every
batch size. With waves of one kind each, the report adds the ceiling of any setting chosen per
wave: each kind's waves at the fixed setting (plain or k) that ran them fastest.

For each batch size every configuration is built up front: plain decoding, every fixed k among the
candidates of the tiers that batch passes through, and the `ema` and `throughput` policies (their
shipped tiers, state kept across waves). Then each wave runs on every configuration in turn (the
order rotates from wave to wave), so drifts of this machine's speed fall on all of them alike.
Reported: tokens/s over all waves, ratios to plain and to the best fixed k, and the per-wave ratio
to plain (median and range). --rounds R runs the whole workload R times.
"""

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

from eyas import SamplingParams
from eyas.bench.metrics import tau_between
from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.target import build_engine, compose_config
from eyas.engine.report.figures import pyplot, save
from eyas.engine.speculative.adaptive.tiers import build_tiers, tier_index
from eyas.engine.speculative.candidate import Candidate
from eyas.prompts.heldout import heldout_prompts
from eyas.prompts.prose import prose_lines


def workload(n: int, wave_size: int, alternate: str) -> list[tuple[str, list[str]]]:
    """n prompts, half code and half prose (prose lines are reused when the file runs out), in waves of
    wave_size as (kind, prompts): alternating prompt by prompt ('mixed' waves) or wave by wave."""
    code = heldout_prompts(n - n // 2)
    lines = prose_lines()
    prose = [lines[i % len(lines)] for i in range(n // 2)]
    if alternate == "prompt":
        prompts = [code[i // 2] if i % 2 == 0 else prose[i // 2] for i in range(n)]
        return [("mixed", prompts[i:i + wave_size]) for i in range(0, n, wave_size)]
    waves = []
    for i in range(0, max(len(code), len(prose)), wave_size):
        waves += [(kind, part[i:i + wave_size]) for kind, part in (("code", code), ("prose", prose)) if part[i:i + wave_size]]
    return waves


def candidates_for(batch_size: int) -> list[int]:
    """Every step count the shipped tiers offer to a batch of this size or smaller."""
    adaptive = compose_config(["adaptive=throughput"])["adaptive"]
    tiers = build_tiers([(t["batch_size"], t["candidates"]) for t in adaptive["tiers"]], Candidate(0))
    return sorted({c.num_steps for t in tiers[: tier_index(tiers, batch_size) + 1] for c in t.candidates
                   if c.is_configured_chain})


class Contender:
    """One configuration's engine and what it measured."""

    def __init__(self, name: str, overrides: list[str]):
        self.name = name
        self.engine = build_engine(overrides)
        self.engine.generate(["def f(x):", "The day"], SamplingParams(max_new_tokens=8, ignore_eos=True))  # warmup
        self.base = self.engine.metrics()
        self.seconds = 0.0
        self.tokens = 0
        self.wave_speeds: list[float] = []
        self.wave_ends: list[int] = []  # cycles of the adaptive controller at the end of each wave
        self.by_kind: dict[str, list[float]] = {}  # wave kind -> [tokens, seconds]

    def run(self, kind: str, wave: list[str], params: SamplingParams) -> None:
        start = time.perf_counter()
        outs = self.engine.generate(wave, params)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for o in outs)
        self.seconds += seconds
        self.tokens += tokens
        self.wave_speeds.append(tokens / seconds)
        totals = self.by_kind.setdefault(kind, [0, 0.0])
        totals[0] += tokens
        totals[1] += seconds
        controller = self.engine.worker.controller if hasattr(self.engine.worker, "controller") else None
        if controller is not None:
            self.wave_ends.append(sum(n for _, n in controller.history))

    def choices(self) -> list[list[int]]:
        """The adaptive controller's [steps, cycles] runs (warmup included; a tree shape at its step count),
        or [] for a fixed configuration."""
        controller = self.engine.worker.controller if hasattr(self.engine.worker, "controller") else None
        if controller is None:
            return []
        return [[choice.num_steps, cycles] for choice, cycles in controller.history]

    def row(self) -> dict:
        metrics, base = self.engine.metrics(), self.base
        row = {"tokens_per_s": self.tokens / self.seconds, "tokens": self.tokens, "seconds": self.seconds,
               "by_kind": {kind: tokens / seconds for kind, (tokens, seconds) in self.by_kind.items()}}
        if "mean_accept_length" in metrics:
            row["tau"] = tau_between(base, metrics) or 0.0
        if "adaptive_cycles_at_steps" in metrics:
            row["cycles_at_steps"] = metrics["adaptive_cycles_at_steps"]
            row["switches"] = metrics["adaptive_switches"]
        return row


def configurations(args, batch_size: int) -> dict[str, list[str]]:
    # a pool just big enough, so every configuration's engine fits in memory at once
    common = [f"cache.max_running_requests={batch_size}", f"cache.max_total_tokens={max(8192, 512 * batch_size)}",
              *args.override]
    spec = [f"speculative={args.kind}", f"draft={args.kind}"]
    configs = {"plain": ["speculative=none", "draft=none", *common]}
    for k in candidates_for(batch_size):
        configs[f"k={k}"] = [*spec, "adaptive=off", f"speculative.num_steps={k}", f"speculative.num_draft_tokens={k + 1}",
                             *common]
    for policy in ("ema", "throughput"):
        configs[policy] = [*spec, f"adaptive={policy}", *common]
    return configs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eyas.bench adaptive", description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="eagle3", choices=["eagle", "eagle3"])
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1, help="run the whole workload this many times")
    p.add_argument("--alternate", default="prompt", choices=["prompt", "wave"],
                   help="code and prose alternate prompt by prompt (mixed waves) or wave by wave")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    add_out_argument(p, "adaptive")
    p.add_argument("--plot", type=Path, default=None, help="also chart them here (PNG; needs matplotlib)")
    p.add_argument("override", nargs="*", help="extra config overrides, e.g. cache.page_size=1")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    print(f"{args.kind}; code and prose alternating {args.alternate} by {args.alternate} x {args.max_new_tokens} new "
          "tokens, T=0; tau = tokens per verify cycle, bonus included; per wave vs plain: median [min-max]", flush=True)
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        num_prompts = max(args.num_prompts, 8 * batch_size)
        waves = workload(num_prompts, 2 * batch_size, args.alternate) * args.rounds
        contenders = [Contender(name, overrides) for name, overrides in configurations(args, batch_size).items()]
        for i, (kind, wave) in enumerate(waves):
            for c in contenders[i % len(contenders):] + contenders[:i % len(contenders)]:
                c.run(kind, wave, params)
            print(f"  batch {batch_size}: wave {i + 1}/{len(waves)}", file=sys.stderr, flush=True)
        rows = {c.name: c.row() for c in contenders}
        plain = rows["plain"]["tokens_per_s"]
        fixed = [c for c in contenders if c.name.startswith("k=")]
        best_fixed_name = max(fixed, key=lambda c: rows[c.name]["tokens_per_s"]).name
        best_fixed = rows[best_fixed_name]["tokens_per_s"]
        plain_waves = contenders[0].wave_speeds
        print(f"\nbatch {batch_size}, {num_prompts} prompts x {args.rounds} round(s), {len(waves)} waves: "
              f"plain {plain:.1f} tok/s; best fixed {best_fixed_name} {best_fixed:.1f} tok/s")
        ceiling = per_wave_ceiling([c for c in contenders if c.name == "plain" or c in fixed])
        if ceiling is not None:
            print(f"ceiling of a setting chosen per wave: {ceiling['tokens_per_s']:.1f} tok/s, "
                  f"{ceiling['tokens_per_s'] / best_fixed:.3f}x the best fixed k ("
                  + ", ".join(f"{kind} at {name}" for kind, name in ceiling["choice"].items()) + ")")
        print(f"{'config':>10} {'tok/s':>7} {'vs plain':>8} {'vs best k':>9} {'per wave vs plain':>19} {'tau':>5}  "
              + ("" if ceiling is None else "tok/s by kind; ") + "steps chosen (cycles), switches")
        for c in contenders:
            r = rows[c.name]
            ratios = sorted(s / p for s, p in zip(c.wave_speeds, plain_waves))
            r.update(vs_plain=r["tokens_per_s"] / plain, vs_best_fixed=r["tokens_per_s"] / best_fixed,
                     wave_ratios_vs_plain=ratios)
            per_wave = f"{ratios[len(ratios) // 2]:.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
            chosen = ""
            if "cycles_at_steps" in r:
                chosen = " ".join(f"{k}:{n}" for k, n in r["cycles_at_steps"].items()) + f", {r['switches']}"
            tau = f"{r['tau']:.2f}" if "tau" in r else "-"
            kinds = "" if ceiling is None else " ".join(f"{k} {v:.1f}" for k, v in r["by_kind"].items()) + "; "
            print(f"{c.name:>10} {r['tokens_per_s']:>7.1f} {r['vs_plain']:>7.2f}x {r['vs_best_fixed']:>8.2f}x "
                  f"{per_wave:>19} {tau:>5}  {kinds}{chosen}", flush=True)
            c.engine.close()
        for c in contenders:
            rows[c.name].update(wave_speeds=c.wave_speeds, wave_ends=c.wave_ends, choices=c.choices())
        results[batch_size] = {"best_fixed": best_fixed_name, "rows": rows, "per_wave_ceiling": ceiling}
        del contenders
        gc.collect()
    table = [{"batch": b, "config": name, **scalars(row)} for b, r in results.items() for name, row in r["rows"].items()]
    write_record(args.out, "adaptive", argv, table, results)
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")


def per_wave_ceiling(fixed: list[Contender]) -> dict | None:
    """Each wave kind's tokens and seconds at the fixed setting (plain or k) that ran that kind fastest,
    summed: the most a setting chosen per wave, knowing the wave's kind, could reach. None for mixed waves."""
    kinds = fixed[0].by_kind
    if set(kinds) == {"mixed"}:
        return None
    choice = {kind: max(fixed, key=lambda c: c.by_kind[kind][0] / c.by_kind[kind][1]) for kind in kinds}
    tokens = sum(choice[kind].by_kind[kind][0] for kind in kinds)
    seconds = sum(choice[kind].by_kind[kind][1] for kind in kinds)
    return {"tokens_per_s": tokens / seconds, "choice": {kind: c.name for kind, c in choice.items()}}


def plot(results: dict, path: Path) -> None:
    """Per batch size: each configuration's tokens/s wave by wave (left), and the step counts the
    adaptive policies chose, cycle by cycle, with the waves marked (right)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(results), 2, figsize=(14, 3.6 * len(results)), squeeze=False)
    for (batch_size, result), (ax_speed, ax_steps) in zip(results.items(), axes):
        for i, (name, row) in enumerate(result["rows"].items()):
            adaptive = bool(row["choices"])
            ax_speed.plot(range(1, len(row["wave_speeds"]) + 1), row["wave_speeds"], marker="o" if adaptive else ".",
                          linewidth=2.2 if adaptive else 0.9, color=f"C{i % 10}", label=name)
            if adaptive:
                runs = row["choices"]
                ends = [0]
                for _, n in runs:
                    ends.append(ends[-1] + n)
                ax_steps.step(ends, [runs[0][0]] + [k for k, _ in runs], where="pre", color=f"C{i % 10}",
                              linewidth=0.8, label=name)
                for end in row["wave_ends"]:
                    ax_steps.axvline(end, color="grey", linewidth=0.4, alpha=0.5)
        ax_speed.set_title(f"batch {batch_size}: tokens/s per wave (best fixed: {result['best_fixed']})", fontsize=9)
        ax_speed.set_xlabel("wave")
        ax_speed.legend(fontsize=7, ncol=2)
        ax_speed.grid(alpha=0.3)
        ax_steps.set_title(f"batch {batch_size}: steps chosen per cycle (grey: wave ends)", fontsize=9)
        ax_steps.set_xlabel("cycle")
        ax_steps.set_ylabel("steps")
        ax_steps.legend(fontsize=7)
    fig.suptitle("adaptive vs fixed step counts, code and prose alternating: measured in one run on one machine",
                 fontsize=10)
    save(fig, path)


if __name__ == "__main__":
    main()
