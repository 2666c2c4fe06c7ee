"""Speculation when requests sample: every configuration against plain decoding at the same settings.

    python -m eyas.bench sampled                                   # T = 0.8, top_p = 0.95, batch 1 and 8
    python -m eyas.bench sampled --temperatures 0.6,0.8,1.0 --batch-sizes 1,8,32 --configs default,k=5,ngram

Held-out standard-library prompts, each request seeded by its prompt's index (the same seed in every
configuration). For each batch size every configuration's engine is built up front; then each wave of
prompts (one `generate` call of `batch size` prompts) runs on every configuration in turn, the order
rotating from wave to wave, so this machine's drifts fall on all of them alike. Each configuration runs
under every `--verify` mode (`speculative.verify`); plain decoding has no verify mode.

Configurations: `default` (the shipped default: adaptive EAGLE-3), `k=N` (EAGLE-3 chain of N steps,
adaptive off), `tree` (the 5x4/16 EAGLE-2 tree), `ngram`. Reported per temperature: tokens/s, the ratio
to plain decoding, tau (tokens per verify cycle, bonus included) and, for adaptive runs, the step
counts chosen.
"""

import argparse
import gc
import time

import torch

from eyas import SamplingParams
from eyas.bench.metrics import tau_between
from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.target import build_engine
from eyas.prompts.heldout import heldout_prompts

CONFIGS = {
    "default": [],
    "tree": ["adaptive=off", "speculative.num_steps=5", "speculative.topk=4", "speculative.num_draft_tokens=16"],
    "ngram": ["speculative=ngram", "draft=ngram"],
}


def config_overrides(name: str) -> list[str]:
    if name.startswith("k="):
        k = int(name[2:])
        return ["adaptive=off", f"speculative.num_steps={k}", f"speculative.num_draft_tokens={k + 1}"]
    if name not in CONFIGS:
        raise SystemExit(f"--configs: unknown configuration {name!r}; choose from default, k=N, tree, ngram")
    return CONFIGS[name]


class Contender:
    def __init__(self, name: str, overrides: list[str]):
        self.name = name
        self.engine = build_engine(overrides)
        self.engine.generate(["def f(x):", "import os"], SamplingParams(max_new_tokens=8, temperature=0.8, seed=0,
                                                                        ignore_eos=True))  # warmup
        self.reset()

    def reset(self) -> None:
        self.base = self.engine.metrics()
        self.seconds, self.tokens = 0.0, 0
        self.outputs: list[list[int]] = []

    def run(self, prompts: list[str], params: list[SamplingParams]) -> None:
        start = time.perf_counter()
        outs = self.engine.generate(prompts, params)
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(o.token_ids) for o in outs)
        self.outputs += [o.token_ids for o in outs]

    def row(self) -> dict:
        metrics, base = self.engine.metrics(), self.base
        row = {"tokens_per_s": self.tokens / self.seconds}
        tau = tau_between(base, metrics)
        if tau is not None:
            row["tau"] = tau
        if "adaptive_cycles_at_steps" in metrics:
            before = base.get("adaptive_cycles_at_steps", {})
            row["cycles_at_steps"] = {k: n - before.get(k, 0) for k, n in metrics["adaptive_cycles_at_steps"].items()
                                      if n > before.get(k, 0)}
        return row


def run_waves(contenders: list[Contender], prompts: list[str], params: list[SamplingParams], batch_size: int) -> None:
    """Each wave of `batch_size` prompts on every contender in turn, the order rotating wave by wave."""
    for i, start in enumerate(range(0, len(prompts), batch_size)):
        wave = slice(start, start + batch_size)
        for c in contenders[i % len(contenders):] + contenders[:i % len(contenders)]:
            c.run(prompts[wave], params[wave])


def compared(contenders: list[Contender]) -> dict:
    """Each contender's row, with its ratio to the first's tokens/s (plain decoding) and whether its
    tokens equal the first's."""
    rows = {c.name: c.row() for c in contenders}
    plain = rows[contenders[0].name]["tokens_per_s"]
    for c in contenders:
        rows[c.name].update(vs_plain=rows[c.name]["tokens_per_s"] / plain,
                            same_as_plain=c.outputs == contenders[0].outputs)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eyas.bench sampled", description=__doc__.split("\n\n")[0])
    p.add_argument("--temperatures", default="0.8")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--configs", default="default,k=5,ngram")
    p.add_argument("--verify", default="reproducible,rejection", help="speculative.verify modes, comma-separated")
    p.add_argument("--num-prompts", type=int, default=8, help="per batch size: max(this, 2 x batch size)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    add_out_argument(p, "sampled")
    p.add_argument("override", nargs="*", help="extra config overrides for every configuration")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    names = [n for n in args.configs.split(",") if n]
    modes = [m for m in args.verify.split(",") if m]
    print(f"held-out code prompts x {args.max_new_tokens} new tokens, top_p={args.top_p}, seeded per prompt; "
          "tau = tokens per verify cycle, bonus included", flush=True)
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        prompts = heldout_prompts(max(args.num_prompts, 2 * batch_size))
        common = [f"cache.max_running_requests={batch_size}", f"cache.max_total_tokens={max(8192, 512 * batch_size)}",
                  *args.override]
        configs = {"plain": ["speculative=none", "draft=none", *common]}
        for name in names:
            for mode in modes or [None]:
                verify = [] if mode is None else [f"speculative.verify={mode}"]
                configs[name if mode is None else f"{name} {mode}"] = [*config_overrides(name), *verify, *common]
        contenders = [Contender(name, overrides) for name, overrides in configs.items()]
        for temperature in temperatures:
            params = [SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temperature, top_p=args.top_p,
                                     seed=i, ignore_eos=True) for i in range(len(prompts))]
            for c in contenders:
                c.reset()
            run_waves(contenders, prompts, params, batch_size)
            rows = compared(contenders)
            plain = rows["plain"]["tokens_per_s"]
            print(f"\nbatch {batch_size}, T={temperature}: {len(prompts)} prompts, plain {plain:.1f} tok/s")
            print(f"{'config':>24} {'tok/s':>7} {'vs plain':>8} {'tau':>5}  same tokens as plain  steps chosen (cycles)")
            for c in contenders:
                r = rows[c.name]
                chosen = " ".join(f"{k}:{n}" for k, n in r.get("cycles_at_steps", {}).items())
                tau = f"{r['tau']:.2f}" if "tau" in r else "-"
                print(f"{c.name:>24} {r['tokens_per_s']:>7.1f} {r['vs_plain']:>7.2f}x {tau:>5}  "
                      f"{'yes' if r['same_as_plain'] else 'no':>20}  {chosen}", flush=True)
            results[f"batch {batch_size}, T={temperature}"] = rows
        for c in contenders:
            c.engine.close()
        del contenders
        gc.collect()
    table = [{"setting": setting, "config": config, **scalars(row)} for setting, rows in results.items()
             for config, row in rows.items()]
    write_record(args.out, "sampled", argv, table, results)


if __name__ == "__main__":
    main()
