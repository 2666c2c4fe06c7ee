"""Adaptive speculation vs every fixed step count vs plain decoding, on a mixed workload.

    python scripts/bench_adaptive.py                        # shipped EAGLE-3, batch sizes 1, 4, 16
    python scripts/bench_adaptive.py --batch-sizes 4 --rounds 2 --max-new-tokens 96

The workload alternates predictable prompts (held-out standard-library code) with hard ones
(English prose, `prompts/natural_language.txt`), all submitted at once; `cache.max_running_requests`
is the batch size, so the batch stays full until the queue drains. For each batch size, in one run:
plain decoding, every fixed k among the candidates of the tiers that batch passes through, and the
`ema` and `throughput` policies (their shipped tiers), each as tokens/s and as ratios to plain and to
the best fixed k. With --rounds R every configuration runs R times, interleaved, and keeps its best.
"""

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import heldout_prompts  # noqa: E402

from containers.compose import compose_config  # noqa: E402
from engine import SamplingParams, build_engine  # noqa: E402
from engine.speculative.adaptive.tiers import build_tiers, tier_index  # noqa: E402

NATURAL_LANGUAGE = Path(__file__).resolve().parent / "prompts" / "natural_language.txt"


def workload(n: int) -> list[str]:
    code = heldout_prompts(n - n // 2)
    prose = [line for line in NATURAL_LANGUAGE.read_text().splitlines() if line.strip()]
    if len(prose) < n // 2:
        raise SystemExit(f"{NATURAL_LANGUAGE} has {len(prose)} prompts, {n // 2} needed")
    mixed = []
    for i in range(n):
        mixed.append(code[i // 2] if i % 2 == 0 else prose[i // 2])
    return mixed


def candidates_for(batch_size: int) -> list[int]:
    """Every step count the shipped tiers offer to a batch of this size or smaller."""
    adaptive = compose_config(["adaptive=throughput"])["adaptive"]
    tiers = build_tiers(adaptive["tiers"], 0)
    return sorted({k for t in tiers[: tier_index(tiers, batch_size) + 1] for k in t.candidates})


def measure(overrides: list[str], prompts: list[str], params: SamplingParams) -> dict:
    with build_engine(overrides) as eng:
        eng.generate(prompts[:2], SamplingParams(max_new_tokens=8, ignore_eos=True))  # warmup
        base = eng.metrics()
        start = time.perf_counter()
        outs = eng.generate(prompts, params)
        seconds = time.perf_counter() - start
        metrics = eng.metrics()
    gc.collect()  # the engine's pools go before the next one is built
    tokens = sum(len(o.token_ids) for o in outs)
    row = {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds}
    if "mean_accept_length" in metrics:
        cycles = metrics["num_verify_cycles"] - base["num_verify_cycles"]
        emitted = (metrics["mean_accept_length"] * metrics["num_verify_cycles"]
                   - base["mean_accept_length"] * base["num_verify_cycles"])
        row["tau"] = emitted / cycles if cycles else 0.0
    if "adaptive_cycles_at_steps" in metrics:
        row["cycles_at_steps"] = metrics["adaptive_cycles_at_steps"]
        row["switches"] = metrics["adaptive_switches"]
    return row


def configurations(args, batch_size: int) -> dict[str, list[str]]:
    common = [f"cache.max_running_requests={batch_size}", *args.override]
    spec = [f"speculative={args.kind}", f"draft={args.kind}"]
    configs = {"plain": ["speculative=none", "draft=none", *common]}
    for k in candidates_for(batch_size):
        configs[f"k={k}"] = [*spec, f"speculative.num_steps={k}", f"speculative.num_draft_tokens={k + 1}", *common]
    for policy in ("ema", "throughput"):
        configs[policy] = [*spec, f"adaptive={policy}", *common]
    return configs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="eagle3", choices=["eagle", "eagle3"])
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("override", nargs="*", help="extra config overrides, e.g. cache.page_size=1")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = workload(args.num_prompts)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    print(f"{args.kind}; {len(prompts)} prompts (code and prose alternating) x {args.max_new_tokens} new tokens, "
          f"T=0, {args.rounds} round(s), best of rounds; tau = tokens per verify cycle, bonus included", flush=True)
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        configs = configurations(args, batch_size)
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for name, overrides in configs.items():
                row = measure(overrides, prompts, params)
                print(f"  batch {batch_size} {name}: {row['tokens_per_s']:.1f} tok/s", file=sys.stderr, flush=True)
                if name not in best or row["tokens_per_s"] > best[name]["tokens_per_s"]:
                    best[name] = row
        plain = best["plain"]["tokens_per_s"]
        fixed = {n: r for n, r in best.items() if n.startswith("k=")}
        best_fixed_name = max(fixed, key=lambda n: fixed[n]["tokens_per_s"])
        best_fixed = fixed[best_fixed_name]["tokens_per_s"]
        print(f"\nbatch {batch_size}: plain {plain:.1f} tok/s; best fixed {best_fixed_name} {best_fixed:.1f} tok/s")
        print(f"{'config':>10} {'tok/s':>7} {'vs plain':>8} {'vs best k':>9} {'tau':>5}  steps chosen (cycles), switches")
        for name, r in best.items():
            r["vs_plain"] = r["tokens_per_s"] / plain
            r["vs_best_fixed"] = r["tokens_per_s"] / best_fixed
            chosen = ""
            if "cycles_at_steps" in r:
                chosen = " ".join(f"{k}:{n}" for k, n in r["cycles_at_steps"].items()) + f", {r['switches']}"
            tau = f"{r['tau']:.2f}" if "tau" in r else "-"
            print(f"{name:>10} {r['tokens_per_s']:>7.1f} {r['vs_plain']:>7.2f}x {r['vs_best_fixed']:>8.2f}x {tau:>5}  {chosen}",
                  flush=True)
        results[batch_size] = {"best_fixed": best_fixed_name, "rows": best}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
