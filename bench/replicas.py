"""Replicas on Ray Serve (`eyas-serve replicas=ray`): prefix-aware routing against the other routings, on
a workload of shared system prompts.

One deployment per routing (a local Ray cluster, `--num-replicas` replicas), started here as a subprocess
and stopped before the next, so one is under load at a time. Each concurrency level (closed loop: that
many streams, each sending its next request when the last one ends) gets system prompts of its own
(`--prefixes` of them, each a standard-library module's documentation, `--per-prefix` questions each, in
one seeded random order), so
every level starts with cold caches and every request is sent once per deployment; every routing gets the
same requests in the same order. Streaming chat completions, greedy, `--max-tokens` new tokens. Per routing
and level:

- throughput: completion tokens / wall time from the first request sent to the last one finished;
- TTFT: from sending a request to its first streamed text, p50 / p90;
- prefix cache hit rate: prompt tokens the replicas found cached / prompt tokens (their `usage`);
- the same over every level's requests together (`all`);
- how the requests spread over the replicas (`x-eyas-replica`), how many went elsewhere than the routing
  policy's first choice (it had no room, or did not tell Ray Serve its queue length in time), how many the
  prefix routing sent away from the replicas holding their prefix because those were too loaded
  (spilled), and errors.

The record (`--out`) keeps every request's times, replica and token counts besides the table.

    python -m eyas.bench replicas                                  # the default model, levels 1, 8, 32
    python -m eyas.bench replicas --model tiny --concurrency 1,8 --prefixes 2 --per-prefix 4

Needs `pip install '.[ray,bench]'`.
"""

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections import Counter

from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.serve import Server, free_port, percentile
from eyas.bench.workloads import shared_system_prompts

PASSED_OVER = "eyas_router_first_choice_passed_over_total"  # the router sent a request elsewhere than it chose
ROUTED = "eyas_router_requests_total"  # by replica and reason; reason "balance": a prefix's holders were too loaded
SPILLED = 'reason="balance"'


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eyas.bench replicas", description=__doc__.split("\n\n")[0])
    p.add_argument("--routings", default="prefix,round_robin", help="replicas.routing values, comma-separated")
    p.add_argument("--concurrency", default="1,8,32", help="concurrent streams per level, comma-separated")
    p.add_argument("--prefixes", type=int, default=4, help="system prompts per level")
    p.add_argument("--per-prefix", type=int, default=16, help="questions per system prompt")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="shuffles the order of the requests (one order for all)")
    p.add_argument("--num-replicas", type=int, default=2)
    p.add_argument("--model", default=None, help="the model group (default: the package's default model)")
    p.add_argument("--overrides", default="", help="extra `key=value` overrides for eyas-serve")
    add_out_argument(p, "replicas")
    return p.parse_args(argv)


async def one_request(client, model: str, messages: list[dict], max_tokens: int) -> dict:
    sent = time.perf_counter()
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True})
        first, usage = None, None
        async for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            if first is None and any(c.delta.content for c in chunk.choices):
                first = time.perf_counter()
        return {"sent": sent, "first": first, "done": time.perf_counter(), "replica": raw.headers.get("x-eyas-replica"),
                "tokens": usage.completion_tokens, "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.prompt_tokens_details.cached_tokens, "error": None}
    except Exception as e:  # noqa: BLE001 - counted in the table
        return {"sent": sent, "first": None, "done": time.perf_counter(), "replica": None, "tokens": 0,
                "prompt_tokens": 0, "cached_tokens": 0, "error": f"{type(e).__name__}: {e}"}


async def run_level(server: Server, conversations: list[list[dict]], streams: int, max_tokens: int) -> dict:
    from openai import AsyncOpenAI

    queue = list(reversed(conversations))
    records = []

    async def worker(client):
        while queue:
            records.append(await one_request(client, server.model, queue.pop(), max_tokens))

    async with AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=3600) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(streams)))
    return {"records": records, "wall_s": time.perf_counter() - start}


def router_counter(server: Server, name: str, label: str = "") -> float:
    """A router counter from the ingress's /metrics, summed over its label sets (those containing `label`)."""
    import re
    import urllib.request

    with urllib.request.urlopen(server.base + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(v) for labels, v in re.findall(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", text, flags=re.M)
               if label in labels)


def summarize(load: dict) -> dict:
    records = [r for r in load["records"] if r["error"] is None]
    ttft = [r["first"] - r["sent"] for r in records if r["first"] is not None]
    tokens = sum(r["tokens"] for r in records)
    prompt = sum(r["prompt_tokens"] for r in records)
    spread = Counter(r["replica"] for r in records)
    return {"requests": len(load["records"]), "errors": len(load["records"]) - len(records),
            "tok_s": tokens / load["wall_s"], "wall_s": load["wall_s"],
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p90_ms": 1e3 * percentile(ttft, 90),
            "hit_rate": sum(r["cached_tokens"] for r in records) / max(1, prompt),
            "prompt_tokens_mean": prompt / max(1, len(records)),
            "per_replica": "/".join(str(n) for _, n in spread.most_common()),
            "first_error": next((r["error"] for r in load["records"] if r["error"]), None)}


def ratio_of(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference and reference == reference else "-"


def start_deployment(args, routing: str, workdir: str) -> Server:
    port = free_port()
    overrides = [f"replicas.routing={routing}", f"replicas.num_replicas={args.num_replicas}", *args.overrides.split()]
    if args.model:
        overrides.append(f"model={args.model}")
    server = Server(f"eyas-{routing}", ["eyas-serve", "replicas=ray", f"server.port={port}", *overrides], port, workdir)
    try:
        until_every_replica_answers(server, args.num_replicas)
    except BaseException:
        server.stop()
        raise
    return server


def until_every_replica_answers(server: Server, num_replicas: int, timeout_s: float = 300) -> None:
    """One-token requests until each replica has answered one: the ingress's router learns of the replicas a
    while after the deployment is up (until then it sends everything to those it knows), and each replica's
    first request pays its warm-up."""
    from openai import OpenAI

    client = OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=300)
    seen, deadline, i = set(), time.monotonic() + timeout_s, 0
    while len(seen) < num_replicas:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {num_replicas} replicas answered within {timeout_s} s")
        raw = client.completions.with_raw_response.create(model=server.model, prompt=f"warm-up {i}", max_tokens=1)
        seen.add(raw.headers["x-eyas-replica"])
        i += 1
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    routings, levels = args.routings.split(","), [int(c) for c in args.concurrency.split(",")]
    rng = random.Random(args.seed)  # one order of arrival, the same for every routing
    workloads = {c: rng.sample(w, len(w)) for c, w in (
        (c, shared_system_prompts(args.prefixes, args.per_prefix, skip=i * args.prefixes)) for i, c in enumerate(levels))}
    print(f"{args.num_replicas} replicas on a local Ray cluster; per level {args.prefixes} system prompts x "
          f"{args.per_prefix} questions, {args.max_tokens} new tokens, greedy, streaming; load average at start: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cpus", flush=True)
    rows, pooled, requests = [], [], []  # pooled: every level's requests of a routing together
    with tempfile.TemporaryDirectory(prefix="bench_replicas_") as workdir:
        for routing in routings:
            server = start_deployment(args, routing, workdir)
            loads = []
            try:
                for streams in levels:
                    passed_over, spilled = router_counter(server, PASSED_OVER), router_counter(server, ROUTED, SPILLED)
                    loads.append(asyncio.run(run_level(server, workloads[streams], streams, args.max_tokens)))
                    summary = summarize(loads[-1])
                    summary["passed_over"] = int(router_counter(server, PASSED_OVER) - passed_over)
                    summary["spilled"] = int(router_counter(server, ROUTED, SPILLED) - spilled)
                    rows.append({"streams": streams, "routing": routing, **summary})
                    requests += [{"streams": streams, "routing": routing, **r} for r in loads[-1]["records"]]
                    print(f"{routing}, {streams} streams: {summary['tok_s']:.1f} tok/s, TTFT p50 "
                          f"{summary['ttft_p50_ms']:.0f} ms, hit rate {summary['hit_rate']:.2f}, errors "
                          f"{summary['errors']}{': ' + summary['first_error'] if summary['errors'] else ''}", flush=True)
                every = summarize({"records": [r for load in loads for r in load["records"]],
                                   "wall_s": sum(load["wall_s"] for load in loads)})
                every["passed_over"] = sum(r["passed_over"] for r in rows if r["routing"] == routing)
                every["spilled"] = sum(r["spilled"] for r in rows if r["routing"] == routing)
                pooled.append({"streams": "all", "routing": routing, **every})
            finally:
                server.stop()
    rows += pooled
    base = routings[-1]
    print(f"\n| streams | routing | tok/s | TTFT p50 / p90 (ms) | prefix cache hit rate | requests per replica | "
          f"not the first choice | spilled | errors | tok/s, TTFT p50 vs {base} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ref = next(b for b in rows if b["streams"] == r["streams"] and b["routing"] == base)
        ratio = f"{ratio_of(r['tok_s'], ref['tok_s'])}, {ratio_of(r['ttft_p50_ms'], ref['ttft_p50_ms'])}"
        print(f"| {r['streams']} | {r['routing']} | {r['tok_s']:.1f} | {r['ttft_p50_ms']:.0f} / {r['ttft_p90_ms']:.0f} | "
              f"{r['hit_rate']:.2f} | {r['per_replica']} | {r['passed_over']} | {r['spilled']} | "
              f"{r['errors']}/{r['requests']} | {ratio} |")
    print(f"\nmean prompt: {rows[0]['prompt_tokens_mean']:.0f} tokens. Ratios were measured in this run, on this "
          f"machine; they do not transfer to other hardware.")
    write_record(args.out, "replicas", argv, [scalars(r) for r in rows], {"rows": rows, "requests": requests})


if __name__ == "__main__":
    main()
