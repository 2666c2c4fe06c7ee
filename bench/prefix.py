"""Prefix caching through the server: time to first token with and without reuse, and hostile input.

Two eyas servers run the shipped pair on their defaults (speculation on), one with the prefix cache
(the default) and one with `cache.prefix_caching=false`, started here as subprocesses; requests go
to them in turn, one at a time, so each scenario's figures come from the same run:

- shared prefix: for each round a fresh ~`--prefix-tokens` held-out code prefix; a cold request
  (prefix + one ending), then a warm one (prefix + another ending). TTFT (send to first streamed
  text) p50 per server, and warm / cold; the warm greedy texts are compared with the offline engine's.
- multi-turn: a chat whose history grows by the assistant's reply and a new user message each turn;
  TTFT per turn per server.
- hostile: one client uploads a `--hostile-mb` MB prompt while another sends an 8-token request; the
  small request's latency and the big one's status.

    python -m eyas.bench prefix                       # 5 rounds, 8 turns
    python -m eyas.bench prefix --rounds 3 --turns 4 --out bench_out

Needs `pip install '.[serve,bench]'`.
"""

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time

from eyas import SamplingParams
from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.serve import Server, free_port
from eyas.bench.target import bench_overrides, build_engine
from eyas.engine.assets import asset_path
from eyas.engine.tokenizer import Tokenizer
from eyas.prompts.heldout import heldout_prompts

SYSTEMS = ("cached", "uncached")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eyas.bench prefix", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prefix-tokens", type=int, default=1200)
    p.add_argument("--max-tokens", type=int, default=16, help="new tokens per request")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--hostile-mb", type=float, default=20.0)
    add_out_argument(p, "prefix")
    return p.parse_args(argv)


def stream(base: str, path: str, body: dict) -> dict:
    """POST a streaming request; TTFT, the text and the usage."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    sent = time.perf_counter()
    conn.request("POST", path, json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    first, pieces, use = None, [], None
    for line in response:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        use = chunk.get("usage") or use
        for choice in chunk.get("choices", []):
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter()
            pieces.append(piece)
    conn.close()
    return {"ttft_s": (first or time.perf_counter()) - sent, "text": "".join(pieces), "usage": use,
            "status": response.status}


def prefixes(tokenizer: Tokenizer, count: int, tokens: int) -> list[str]:
    """`count` held-out code prefixes of about `tokens` tokens, each from different files."""
    pieces = heldout_prompts(count * 12, prompt_chars=600)
    out = []
    for i in range(count):
        text = ""
        for piece in pieces[i::count]:
            if len(tokenizer.encode(text)) >= tokens:
                break
            text += piece
        ids = tokenizer.encode(text)[:tokens]
        out.append(tokenizer.decode(ids))
    return out


def shared_prefix(servers: dict, model: str, tokenizer: Tokenizer, args) -> dict:
    texts = prefixes(tokenizer, args.rounds + 1, args.prefix_tokens)
    endings = ["\ndef helper(value):", "\nclass Result:"]
    rows = {name: [] for name in servers}
    for r, prefix in enumerate(texts):
        order = list(servers) if r % 2 == 0 else list(servers)[::-1]
        for name in order:
            cold = stream(servers[name].base, "/v1/completions", dict(model=model, prompt=prefix + endings[0],
                                                                       max_tokens=args.max_tokens, temperature=0))
            warm = stream(servers[name].base, "/v1/completions", dict(model=model, prompt=prefix + endings[1],
                                                                       max_tokens=args.max_tokens, temperature=0))
            if r:  # the first round warms the servers up
                rows[name].append({"cold": cold, "warm": warm, "prompt": prefix + endings[1]})
    with build_engine([]) as engine:  # the offline engine on the same defaults
        offline = [o.text for o in engine.generate([row["prompt"] for row in rows["cached"]],
                                                   SamplingParams(max_new_tokens=args.max_tokens))]
    result = {}
    for name, runs in rows.items():
        cold = statistics.median(x["cold"]["ttft_s"] for x in runs)
        warm = statistics.median(x["warm"]["ttft_s"] for x in runs)
        result[name] = {
            "prompt_tokens": statistics.median(x["warm"]["usage"]["prompt_tokens"] for x in runs),
            "cached_tokens": statistics.median(x["warm"]["usage"]["prompt_tokens_details"]["cached_tokens"]
                                               for x in runs),
            "cold_ttft_ms": 1000 * cold, "warm_ttft_ms": 1000 * warm, "warm_over_cold": warm / cold,
            "warm_text_equals_offline": sum(x["warm"]["text"] == t for x, t in zip(runs, offline)),
            "rounds": len(runs),
        }
    return result


def multi_turn(servers: dict, model: str, args) -> dict:
    user = heldout_prompts(args.turns, prompt_chars=300)
    result = {}
    for name in servers:
        messages, ttfts = [{"role": "system", "content": "You complete Python code."}], []
        for turn in range(args.turns):
            messages.append({"role": "user", "content": user[turn]})
            reply = stream(servers[name].base, "/v1/chat/completions",
                           dict(model=model, messages=messages, max_tokens=args.max_tokens, temperature=0))
            messages.append({"role": "assistant", "content": reply["text"]})
            ttfts.append({"prompt_tokens": reply["usage"]["prompt_tokens"],
                          "cached_tokens": reply["usage"]["prompt_tokens_details"]["cached_tokens"],
                          "ttft_ms": 1000 * reply["ttft_s"]})
        result[name] = ttfts
    return result


def hostile(server: Server, model: str, megabytes: float) -> dict:
    """A big upload in flight (declared and sent in pieces) while a small request runs."""
    size = int(megabytes * 1e6)
    status = {}

    def upload():
        host, port = server.base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {size}\r\n\r\n".encode())
            body = (b'{"model": "' + model.encode() + b'", "prompt": "' + b"x" * (size - 40)).ljust(size - 2, b"x") + b'"}'
            try:
                for i in range(0, size, 1 << 16):
                    conn.sendall(body[i:i + (1 << 16)])
            except OSError:
                pass  # refused before the upload finished
            status["reply"] = conn.recv(200).split(b"\r\n")[0].decode(errors="replace")

    thread = threading.Thread(target=upload)
    thread.start()
    time.sleep(0.2)
    start = time.perf_counter()
    small = stream(server.base, "/v1/completions", dict(model=model, prompt="def f():", max_tokens=8, temperature=0))
    latency = time.perf_counter() - start
    thread.join(timeout=120)
    return {"small_request_s": latency, "small_status": small["status"], "upload_reply": status.get("reply")}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tokenizer = Tokenizer.from_dir(asset_path("target"))
    workdir = tempfile.mkdtemp(prefix="eyas-bench-prefix-")
    servers = {}
    try:
        for name, extra in (("cached", []), ("uncached", ["cache.prefix_caching=false"])):
            port = free_port()
            servers[name] = Server(name, [sys.executable, "-m", "eyas.launch.serve", f"server.port={port}",
                                          *bench_overrides(extra)],
                                   port, workdir)
        model = servers["cached"].model
        report = {"shared_prefix": shared_prefix(servers, model, tokenizer, args),
                  "multi_turn": multi_turn(servers, model, args),
                  "hostile": hostile(servers["cached"], model, args.hostile_mb)}
    finally:
        for server in servers.values():
            server.stop()
    print("shared prefix (median over rounds):")
    print(f"  {'server':<9} {'prompt':>6} {'cached':>6} {'cold ms':>8} {'warm ms':>8} {'warm/cold':>9} {'= offline':>9}")
    for name, r in report["shared_prefix"].items():
        print(f"  {name:<9} {r['prompt_tokens']:>6.0f} {r['cached_tokens']:>6.0f} {r['cold_ttft_ms']:>8.1f} "
              f"{r['warm_ttft_ms']:>8.1f} {r['warm_over_cold']:>9.2f} {r['warm_text_equals_offline']:>5}/{r['rounds']}")
    print("multi-turn TTFT ms per turn (prompt tokens / cached):")
    for name, turns in report["multi_turn"].items():
        print(f"  {name:<9} " + "  ".join(f"{t['ttft_ms']:.0f} ({t['prompt_tokens']}/{t['cached_tokens']})"
                                          for t in turns))
    h = report["hostile"]
    print(f"hostile: {args.hostile_mb:g} MB upload answered {h['upload_reply']!r}; meanwhile an 8-token request "
          f"took {h['small_request_s']:.2f} s (HTTP {h['small_status']})")
    table = [{"server": name, **scalars(r)} for name, r in report["shared_prefix"].items()]
    write_record(args.out, "prefix", argv, table, report)


if __name__ == "__main__":
    main()
