"""Serving under load: eyas's OpenAI server against `transformers serve --continuous-batching`.

Both servers run the shipped target (eyas with its defaults: EAGLE-3 speculation) from the same
directory on this machine, started here as subprocesses and kept up side by side; only one is under
load at a time. For each request rate, the same held-out code prompts are sent to each server with
the same Poisson arrival times (seeded; `inf`: all at once, the saturated case), streaming, greedy,
`--max-tokens` new tokens each (eos ends a request early on both). The order of the servers
alternates from rate to rate. Per server and rate it reports:

- throughput: completion tokens (each server's own `usage`) / wall time from the first request sent
  to the last one finished; requests/s likewise;
- TTFT: time from sending a request to its first streamed text, p50 / p99 over requests;
- TPOT: per request, (last chunk - first chunk) / (completion tokens - 1), p50 / p99 over requests;
- ITL: gaps between consecutive streamed chunks, p50 / p99 (a speculative step streams several
  tokens in one chunk, so eyas has fewer, longer gaps than one-token-per-chunk servers);
- how many greedy texts equal the other server's for the same prompt.

    python -m eyas.bench serve                       # rates 2, 8, 32, inf; 64 requests of 128 tokens
    python -m eyas.bench serve --rates 2,inf --num-requests 16 --max-tokens 32 --plot bench_serve.png

Needs `pip install '.[serve,bench]'` (fastapi, uvicorn and accelerate for `transformers serve`, the
`openai` client).
"""

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.target import bench_overrides
from eyas.engine.assets import asset_path
from eyas.engine.report.figures import pyplot, save
from eyas.prompts.heldout import heldout_prompts

SYSTEMS = ("eyas", "transformers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eyas.bench serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="2,8,32,inf", help="requests per second, comma-separated; inf: all at once")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="seeds the arrival times")
    p.add_argument("--eyas-overrides", default="", help="extra `key=value` overrides for python -m eyas.launch.serve")
    add_out_argument(p, "serve")
    p.add_argument("--plot", type=Path, default=None, help="also chart throughput, TTFT and TPOT against the rate")
    return p.parse_args(argv)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess, healthy on 127.0.0.1, and the model id it answers to."""

    def __init__(self, name: str, command: list[str], port: int, workdir: str):
        self.name, self.base = name, f"http://127.0.0.1:{port}"
        self.log = open(Path(workdir) / f"{name}.log", "w")
        self.proc = subprocess.Popen(command, cwd=workdir, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.proc.returncode}); see {self.log.name}")
            try:
                with urllib.request.urlopen(self.base + "/v1/models", timeout=5) as r:
                    self.model = json.loads(r.read())["data"][0]["id"]
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"{name} did not come up; see {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def start_servers(args, workdir: str) -> dict[str, Server]:
    target = str(asset_path("target"))
    eyas_port, hf_port = free_port(), free_port()
    servers = {}
    try:
        servers["eyas"] = Server("eyas", [sys.executable, "-m", "eyas.launch.serve", f"server.port={eyas_port}",
                                          *bench_overrides(args.eyas_overrides.split())], eyas_port, workdir)
        servers["transformers"] = Server("transformers", ["transformers", "serve", target, "--continuous-batching",
                                                          "--device", "cpu", "--port", str(hf_port)], hf_port, workdir)
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


async def one_request(client, model: str, prompt: str, max_tokens: int, delay: float, start: float) -> dict:
    await asyncio.sleep(max(0.0, start + delay - time.perf_counter()))
    sent = time.perf_counter()
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
    chunks, pieces, tokens = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.text:
                chunks.append(time.perf_counter())
                pieces.append(choice.text)
    return {"sent": sent, "chunks": chunks, "done": time.perf_counter(), "tokens": tokens or 0, "text": "".join(pieces)}


async def run_load(server: Server, prompts: list[str], arrivals: list[float], max_tokens: int) -> dict:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=3600) as client:
        await one_request(client, server.model, prompts[0], 4, 0.0, time.perf_counter())  # warm up
        start = time.perf_counter()
        records = await asyncio.gather(*(one_request(client, server.model, p, max_tokens, a, start)
                                         for p, a in zip(prompts, arrivals)))
    wall = max(r["done"] for r in records) - start
    return {"records": records, "wall_s": wall}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summarize(load: dict) -> dict:
    records = load["records"]
    ttft = [r["chunks"][0] - r["sent"] for r in records if r["chunks"]]
    tpot = [(r["chunks"][-1] - r["chunks"][0]) / (r["tokens"] - 1) for r in records if r["tokens"] > 1 and r["chunks"]]
    itl = [b - a for r in records for a, b in zip(r["chunks"], r["chunks"][1:])]
    tokens = sum(r["tokens"] for r in records)
    return {"tokens": tokens, "wall_s": load["wall_s"], "tok_s": tokens / load["wall_s"],
            "req_s": len(records) / load["wall_s"],
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99),
            "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99)}


def arrivals_for(rate: float, n: int, rng: random.Random) -> list[float]:
    if math.isinf(rate):
        return [0.0] * n
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def print_table(rows: list[dict]) -> None:
    print("\n| rate (req/s) | server | tok/s | req/s | eyas / transformers | TTFT p50 / p99 (ms) | "
          "TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) | texts equal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['rate']} | {r['system']} | {r['tok_s']:.1f} | {r['req_s']:.2f} | {r.get('ratio', '')} | "
              f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} | "
              f"{r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | {r['equal']} |")


def plot(rows: list[dict], path: Path) -> Path:
    plt = pyplot()
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for system in SYSTEMS:
        mine = {r["rate"]: r for r in rows if r["system"] == system}
        for ax, key, label in ((axes[0], "tok_s", "throughput (tok/s)"), (axes[1], "ttft_p50_ms", "TTFT p50 (ms)"),
                               (axes[2], "tpot_p50_ms", "TPOT p50 (ms)")):
            ax.plot(range(len(rates)), [mine[r][key] for r in rates], marker="o", label=system)
            ax.set_xticks(range(len(rates)), rates)
            ax.set_xlabel("request rate (req/s)")
            ax.set_title(label)
    axes[0].legend()
    return save(fig, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    prompts = heldout_prompts(args.num_requests)
    rng = random.Random(args.seed)
    print(f"{args.num_requests} held-out code prompts, {args.max_tokens} new tokens each, greedy, streaming; "
          f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cpus")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as workdir:
        servers = start_servers(args, workdir)
        try:
            for i, rate in enumerate(rates):
                arrivals = arrivals_for(rate, args.num_requests, rng)
                order = SYSTEMS if i % 2 == 0 else SYSTEMS[::-1]
                loads = {name: asyncio.run(run_load(servers[name], prompts, arrivals, args.max_tokens)) for name in order}
                texts = {name: [r["text"] for r in load["records"]] for name, load in loads.items()}
                equal = sum(a == b for a, b in zip(texts["eyas"], texts["transformers"]))
                summary = {name: summarize(load) for name, load in loads.items()}
                for name in SYSTEMS:
                    row = {"rate": "inf" if math.isinf(rate) else f"{rate:g}", "system": name, **summary[name],
                           "equal": f"{equal}/{args.num_requests}"}
                    if name == "eyas":
                        row["ratio"] = f"{summary['eyas']['tok_s'] / summary['transformers']['tok_s']:.2f}x"
                    rows.append(row)
                print(f"rate {rate:g}: eyas {summary['eyas']['tok_s']:.1f} tok/s, "
                      f"transformers {summary['transformers']['tok_s']:.1f} tok/s", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    print_table(rows)
    print("\nRatios were measured in this run, on this machine; they do not transfer to other hardware.")
    write_record(args.out, "serve", argv, [scalars(r) for r in rows], {"rows": rows})
    if args.plot is not None:
        print(f"wrote {plot(rows, args.plot)}")


if __name__ == "__main__":
    main()
