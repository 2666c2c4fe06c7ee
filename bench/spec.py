"""Speculative vs plain decoding on held-out prompts (`--workload`, bench/workloads.py), with the shipped pair.

    python -m eyas.bench spec                          # EAGLE-3, k = 1..6, T=0, batch 1, 20 prompts x 128 tokens
    python -m eyas.bench spec --kind eagle --ks 2,4 --trees 5:4:16 --temperature 1.0
    python -m eyas.bench spec --ks 3,5 --trees 5:4:16 --graphs   # each phase eager and compiled

Beside the chains, EAGLE-2 trees (`--trees steps:topk:nodes,...`) get the same columns (acceptance
by depth; t_draft is the tree's draft phase per cycle / steps) and their ratios to the fastest chain.

For each k, in one run: tau (tokens per verify cycle, bonus included), per-position acceptance
(unconditional: accepted at position i / cycles), plain and speculative tokens/s and the speedup;
the measured costs of a target decode step, a verify forward (k+1 tokens), one draft step and one
draft-extend; the ideal speedup tau * t_decode / (t_verify + k * t_draft + t_extend), and the
efficiency = measured speedup / ideal. Times are wall-clock means over the decode phase (prefill
excluded), measured in this run on this machine.

Each phase also gets its floor: the time of the phase's GEMMs alone. Every projection GEMM of the run
(the fused q/k/v, o, gate/up, down, fc and lm_head calls, or the nn.Linear ones of a model that runs
its modules one by one, with their row counts) is recorded per phase, then replayed back to back on the same weights after the run; floor = replay time / phase
count, and overhead = phase time - floor (everything that is not a GEMM: attention, norms, RoPE,
batch building, sampling, Python).

`--graphs` runs every configuration a second time with its forwards as compiled graphs
(`graphs.mode=compile`) and prints each phase's time eager and graphed, side by side. Floors come from
the eager run only: a GEMM inside a compiled graph cannot be recorded.
"""

import argparse
import contextlib
import time
from pathlib import Path

import torch

from eyas import SamplingParams
from eyas.bench.metrics import tau_between
from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.target import build_engine
from eyas.bench.timer import GemmRecorder, PhaseTimer
from eyas.bench.workloads import CHAT_WORKLOADS, WORKLOADS, chat_prompts_for, workload_prompts
from eyas.engine.report.figures import pyplot, save
from eyas.engine.sampling import SamplingBatch


class ChoiceProbe:
    """Keeps the last call of a token-choice function (the plain worker's `sample`, the verifier's `accept`)
    and times it again afterwards on the same logits, as called and with every request greedy: the cost
    of choosing a sampled position against a greedy one, per position (logits row)."""

    def __init__(self, obj, name: str):
        self.inner = getattr(obj, name)
        self.last = None

        def keep(logits, *args, **kwargs):
            self.last = (logits, args, kwargs)
            return self.inner(logits, *args, **kwargs)

        setattr(obj, name, keep)

    def per_position(self, repeats: int = 50) -> tuple[float, float]:
        """(sampled, greedy) seconds per position; nan before any call."""
        if self.last is None:
            return float("nan"), float("nan")
        logits, args, kwargs = self.last
        greedy_args = tuple(SamplingBatch(a.size) if isinstance(a, SamplingBatch) else a for a in args)
        times = []
        for call_args in (args, greedy_args):
            with torch.inference_mode():
                self.inner(logits, *call_args, **kwargs)
                start = time.perf_counter()
                for _ in range(repeats):
                    self.inner(logits, *call_args, **kwargs)
            times.append((time.perf_counter() - start) / repeats / logits.shape[0])
        return times[0], times[1]


def run(engine, prompts: list[str], params: SamplingParams, batch_size: int) -> tuple[float, int]:
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch_size):
        tokens += sum(len(o.token_ids) for o in engine.generate(prompts[i:i + batch_size], params))
    return time.perf_counter() - start, tokens


def recorder(graphs: bool):
    """A GEMM recorder for an eager run; none for a graphed one (its GEMMs run inside the graph)."""
    return contextlib.nullcontext() if graphs else GemmRecorder()


def graph_overrides(graphs: bool) -> list[str]:
    return ["graphs.mode=compile"] if graphs else []


def plain(args, prompts, params, graphs: bool = False):
    with build_engine(["speculative=none", "draft=none", *args.override, *graph_overrides(graphs)]) as eng, \
            recorder(graphs) as gemms:
        timer = PhaseTimer(gemms).attach(eng)
        choice = ChoiceProbe(eng.worker.sampler, "sample")
        run(eng, prompts[:2], params, args.batch_size)  # warmup
        timer.clear()
        seconds, tokens = run(eng, prompts, params, args.batch_size)
        return tokens / seconds, timer.mean("decode"), timer.floor("decode"), choice.per_position()


def speculative(args, prompts, params, k, topk=1, nodes=None, graphs: bool = False):
    """A chain of k steps, or (topk > 1) an EAGLE-2 tree of `nodes` nodes grown over k steps."""
    nodes = k + 1 if topk == 1 else nodes
    overrides = [f"speculative={args.kind}", f"draft={args.kind}", "adaptive=off", f"speculative.num_steps={k}",
                 f"speculative.topk={topk}", f"speculative.num_draft_tokens={nodes}", *args.override,
                 *graph_overrides(graphs)]
    with build_engine(overrides) as eng, recorder(graphs) as gemms:
        timer = PhaseTimer(gemms).attach(eng)
        choice = ChoiceProbe(eng.worker.verifier, "accept")
        run(eng, prompts[:2], params, args.batch_size)
        timer.clear()
        base = eng.metrics()
        seconds, tokens = run(eng, prompts, params, args.batch_size)
        metrics = eng.metrics()
        floors = {"verify": timer.floor("verify"), "extend": timer.floor("extend"),
                  "draft": timer.floor("draft") / k}
        t_choice_sampled, t_choice_greedy = choice.per_position()
    cycles = metrics["num_verify_cycles"] - base["num_verify_cycles"]
    positions = [(a * metrics["num_verify_cycles"] - b * base["num_verify_cycles"]) / cycles
                 for a, b in zip(metrics["accept_rate_per_position"], base["accept_rate_per_position"] or [0] * k)]
    return {
        "k": k, "topk": topk, "nodes": nodes, "label": str(k) if topk == 1 else f"{k}x{topk}/{nodes}",
        "tau": tau_between(base, metrics), "accept_per_position": positions, "tokens_per_s": tokens / seconds,
        "t_verify": timer.mean("verify"), "t_extend": timer.mean("extend"),
        "t_draft": timer.mean("draft") / k,  # draft phase per cycle / k (k proposals, k - 1 forwards)
        "t_host": timer.mean("host"),  # scheduling, stop checks and caching between two cycles
        "floor_verify": floors["verify"], "floor_draft": floors["draft"], "floor_extend": floors["extend"],
        "t_choice_sampled": t_choice_sampled, "t_choice_greedy": t_choice_greedy,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eyas.bench spec", description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="eagle3", choices=["eagle", "eagle3"])
    p.add_argument("--ks", default="1,2,3,4,5,6")
    p.add_argument("--trees", default="5:2:8,5:4:16,5:8:16,6:4:24",
                   help="EAGLE-2 tree shapes num_steps:topk:num_draft_tokens, comma-separated ('' for none)")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--workload", default="stdlib", choices=WORKLOADS + CHAT_WORKLOADS,
                   help="the prompts (bench/workloads.py); chat: rendered with the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--logprobs", type=int, default=None,
                   help="every request asks for this many logprobs (their forwards run exact: what that costs)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--graphs", action="store_true",
                   help="run every configuration again with compiled graphs and print each phase eager and graphed")
    add_out_argument(p, "spec")
    p.add_argument("--plot", type=Path, default=None, help="also chart them here (PNG; needs matplotlib)")
    p.add_argument("override", nargs="*", help="extra config overrides, e.g. model.path=/ckpt")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = workload_prompts(args.workload, args.num_prompts)
    chat = args.workload == "chat"  # a chat model's answer ends at its end-of-turn token
    if chat:
        prompts = chat_prompts_for(prompts, args.override)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=0, ignore_eos=not chat, logprobs=args.logprobs)
    shapes = [(int(k), 1, None) for k in args.ks.split(",")]
    shapes += [tuple(int(v) for v in shape.split(":")) for shape in filter(None, args.trees.split(","))]
    plain_tps, t_decode, floor_decode, plain_choice = plain(args, prompts, params)
    rows = [speculative(args, prompts, params, *shape) for shape in shapes]
    chains = [r for r in rows if r["topk"] == 1]
    print(f"{args.kind}, {len(prompts)} {args.workload} prompts x {args.max_new_tokens} new tokens, T={args.temperature}, "
          f"top_p={args.top_p}, "
          f"batch {args.batch_size}; plain decoding {plain_tps:.1f} tok/s, target decode step {t_decode * 1e3:.2f} ms")
    print("tau: tokens per verify cycle (bonus included); acceptance per position: accepted at i / cycles")
    print("rows: k (a chain of k draft steps) or steps x topk / nodes (an EAGLE-2 tree; acceptance by depth)")
    header = (f"{'k':>9} {'tau':>5} {'spec tok/s':>10} {'speedup':>7} {'t_verify':>8} {'t_draft':>7} "
              f"{'t_extend':>8} {'ideal':>6} {'effic.':>6}  acceptance per position")
    print(header)
    for r in rows:
        ideal = r["tau"] * t_decode / (r["t_verify"] + r["k"] * r["t_draft"] + r["t_extend"])
        r.update(speedup=r["tokens_per_s"] / plain_tps, ideal_speedup=ideal)
        r["efficiency"] = r["speedup"] / ideal
        print(f"{r['label']:>9} {r['tau']:>5.2f} {r['tokens_per_s']:>10.1f} {r['speedup']:>6.2f}x "
              f"{r['t_verify'] * 1e3:>6.2f}ms {r['t_draft'] * 1e3:>5.2f}ms {r['t_extend'] * 1e3:>6.2f}ms "
              f"{ideal:>5.2f}x {r['efficiency']:>6.2f}  " + " ".join(f"{a:.2f}" for a in r["accept_per_position"]))
    print("floors (GEMMs of the phase alone, replayed after the run) and overhead above them, per phase:")
    print(f"{'k':>9} {'phase':>8} {'time':>8} {'floor':>8} {'overhead':>8} {'floor share':>11}")
    ms = lambda t: f"{t * 1e3:6.2f}ms"  # noqa: E731
    phases = [(None, "decode", t_decode, floor_decode)] + [
        (r["label"], name, r[f"t_{name}"], r[f"floor_{name}"]) for r in rows for name in ("verify", "draft", "extend")]
    for k, name, t, f in phases:
        print(f"{'-' if k is None else k:>9} {name:>8} {ms(t):>8} {ms(f):>8} {ms(t - f):>8} {f / t:>11.2f}")
    if args.temperature > 0:
        us = lambda t: f"{t * 1e6:.0f} us"  # noqa: E731
        print("choosing tokens, per position (logits row), sampled vs greedy (the last call replayed after the run):")
        print(f"  plain decode: {us(plain_choice[0])} vs {us(plain_choice[1])}")
        for r in rows:
            print(f"  {r['label']:>9} verify: {us(r['t_choice_sampled'])} vs {us(r['t_choice_greedy'])}")
    trees = [r for r in rows if r["topk"] > 1]
    if trees:
        best = max(chains, key=lambda r: r["tokens_per_s"])
        print(f"trees against the fastest chain (k={best['k']}, {best['tokens_per_s']:.1f} tok/s, tau {best['tau']:.2f}):")
        for r in trees:
            print(f"  {r['label']:>9}: tokens/s x{r['tokens_per_s'] / best['tokens_per_s']:.2f}, "
                  f"tau x{r['tau'] / best['tau']:.2f}")
    graphed = None
    if args.graphs:
        graphed_plain = plain(args, prompts, params, graphs=True)
        graphed = {"plain_tokens_per_s": graphed_plain[0], "t_decode": graphed_plain[1],
                   "rows": [speculative(args, prompts, params, *shape, graphs=True) for shape in shapes]}
        print_graphed(plain_tps, t_decode, rows, graphed)
    chain_steps = [r["t_draft"] for r in chains]
    if chain_steps:
        step = sum(chain_steps) / len(chain_steps)
        print(f"one draft step (draft phase / k, chains): {step * 1e3:.2f} ms = {step / t_decode:.3f} of a target "
              "decode step; host work between two cycles: "
              + ", ".join(f"{r['label']}: {r['t_host'] * 1e3:.2f} ms" for r in rows))
    table = [{"config": "plain", "tokens_per_s": plain_tps, "t_decode": t_decode, "floor_decode": floor_decode},
             *({"config": f"k={r['label']}", **scalars(r)} for r in rows)]
    write_record(args.out, "spec", argv, table,
                 {"plain_tokens_per_s": plain_tps, "t_decode": t_decode, "floor_decode": floor_decode,
                  "plain_choice_sampled": plain_choice[0], "plain_choice_greedy": plain_choice[1], "rows": rows,
                  "graphed": graphed})
    if args.plot:
        plot(args, rows, args.plot)
        print(f"wrote {args.plot}")


def print_graphed(plain_tps: float, t_decode: float, rows: list[dict], graphed: dict) -> None:
    """Each phase's time and each configuration's tokens/s, eager against graphed (both measured in this run)."""
    print("eager vs graphed (graphs.mode=compile), per phase (ms, means over the decode phase) and tokens/s:")
    print(f"{'k':>9} {'phase':>8} {'eager':>9} {'graphed':>9} {'ratio':>6}")
    phases = [("-", "decode", t_decode, graphed["t_decode"]), ("-", "tok/s", plain_tps, graphed["plain_tokens_per_s"])]
    for eager, compiled in zip(rows, graphed["rows"]):
        phases += [(eager["label"], name, eager[f"t_{name}"], compiled[f"t_{name}"]) for name in ("verify", "draft", "extend")]
        phases.append((eager["label"], "tok/s", eager["tokens_per_s"], compiled["tokens_per_s"]))
    for label, name, eager, compiled in phases:
        if name == "tok/s":  # higher is better: the ratio is graphed / eager
            print(f"{label:>9} {name:>8} {eager:>9.1f} {compiled:>9.1f} {compiled / eager:>5.2f}x")
        else:  # a time: the ratio is eager / graphed (the speedup)
            print(f"{label:>9} {name:>8} {eager * 1e3:>7.2f}ms {compiled * 1e3:>7.2f}ms {eager / compiled:>5.2f}x")


def plot(args, rows: list[dict], path: Path) -> None:
    """Speedup (measured and ideal) and tau against k, and acceptance by position for each k."""
    plt = pyplot()
    trees = [r for r in rows if r["topk"] > 1]
    rows = [r for r in rows if r["topk"] == 1]
    ks = [r["k"] for r in rows]
    fig, (ax_speed, ax_tau, ax_accept) = plt.subplots(1, 3, figsize=(15, 4))
    ax_speed.plot(ks, [r["speedup"] for r in rows], marker="o", label="measured")
    ax_speed.plot(ks, [r["ideal_speedup"] for r in rows], marker="o", linestyle="--", label="ideal")
    ax_speed.axhline(1.0, color="black", linewidth=0.8)
    ax_speed.set_title("speedup over plain decoding")
    ax_speed.legend(fontsize=8)
    ax_tau.plot(ks, [r["tau"] for r in rows], marker="o", label="chain")
    for i, r in enumerate(trees):  # a tree at its step count
        ax_speed.plot([r["k"]], [r["speedup"]], marker="*", markersize=12, linestyle="", color=f"C{i + 2}",
                      label=f"tree {r['label']}")
        ax_tau.plot([r["k"]], [r["tau"]], marker="*", markersize=12, linestyle="", color=f"C{i + 2}",
                    label=f"tree {r['label']}")
    ax_tau.set_title("tau (tokens per verify cycle)")
    ax_tau.legend(fontsize=8)
    for i, r in enumerate(rows):
        ax_accept.plot(range(1, len(r["accept_per_position"]) + 1), r["accept_per_position"], marker="o",
                       color=f"C{i % 10}", label=f"k={r['k']}")
    ax_accept.set_title("acceptance by position")
    ax_accept.set_xticks(range(1, max(ks + [r["k"] for r in trees]) + 1))
    ax_accept.set_ylim(0, 1.02)
    ax_accept.legend(fontsize=8)
    for ax in (ax_speed, ax_tau):
        ax.set_xlabel("k (draft steps)")
        ax.set_xticks(ks)
    for ax in (ax_speed, ax_tau, ax_accept):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{args.kind}, T={args.temperature}, batch {args.batch_size}, {args.max_new_tokens} new tokens: "
                 "measured in one run on one machine", fontsize=10)
    save(fig, path)


if __name__ == "__main__":
    main()
