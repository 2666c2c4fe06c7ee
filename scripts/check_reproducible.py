"""Seeded sampled output across configurations, on held-out prompts with the shipped pair.

    python scripts/check_reproducible.py                      # batch 16, T = 0.8, top_p = 0.95
    python scripts/check_reproducible.py --temperature 1.0 --top-k 50 --batch-size 8

Runs plain decoding, the default speculative config, `speculative.num_steps=5`, and
`adaptive=throughput` and `adaptive=ema` on the same prompts with per-request seeds, each speculative
one with `speculative.verify=reproducible` (the mode whose seeded output is plain decoding's), and
prints per config how many requests emitted exactly plain decoding's token ids, with tau and
tokens/s. Exits 1 when any differ.
"""

import argparse
import sys
import time

from eyas import SamplingParams
from eyas.bench.target import build_engine
from eyas.prompts.heldout import heldout_prompts

REPRODUCIBLE = "speculative.verify=reproducible"
CONFIGS = {
    "plain": ["speculative=none", "draft=none"],
    "default": [REPRODUCIBLE],
    "num_steps=5": ["adaptive=off", "speculative.num_steps=5", REPRODUCIBLE],
    "adaptive=throughput": ["adaptive=throughput", REPRODUCIBLE],
    "adaptive=ema": ["adaptive=ema", REPRODUCIBLE],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0, help="request i gets seed + i")
    p.add_argument("override", nargs="*", help="extra config overrides for every run")
    args = p.parse_args()

    prompts = heldout_prompts(args.batch_size)
    params = [SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, seed=args.seed + i, ignore_eos=True) for i in range(len(prompts))]
    results = {}
    for name, overrides in CONFIGS.items():
        with build_engine([*overrides, *args.override, f"cache.max_running_requests={args.batch_size}"]) as eng:
            start = time.perf_counter()
            outs = eng.generate(prompts, params)
            seconds = time.perf_counter() - start
            metrics = eng.metrics()
        results[name] = [o.token_ids for o in outs]
        same = sum(a == b for a, b in zip(results[name], results["plain"]))
        tau = metrics.get("mean_accept_length")
        print(f"{name:22s} identical to plain: {same}/{len(prompts)}   "
              f"tau {tau if tau is None else round(tau, 2)}   "
              f"{sum(map(len, results[name])) / seconds:.0f} tok/s", flush=True)
    distinct = len({tuple(t) for t in results["plain"]})
    print(f"{distinct} distinct outputs among {len(prompts)} requests")
    if any(results[name] != results["plain"] for name in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
