"""Plain-decode throughput: eyas `Engine.generate` vs Hugging Face `LlamaForCausalLM.generate`.

Both run the same float32 checkpoint on the same random token-id prompts with greedy decoding and a
fixed number of new tokens (eos ignored), at each batch size. Throughput is generated tokens
(batch * max_new_tokens) over the wall time of the generate call, prefill included; each side gets
one untimed warmup per batch size, then the two sides' timed runs alternate and the best (fastest)
of `--repeats` is reported for each.
The ratio eyas/transformers is measured in the same process on the same machine, so it says
nothing about other hardware. Greedy outputs are compared token for token (informational).

    python -m eyas.bench decode                      # random 8-layer Llama written to a temp dir
    python -m eyas.bench decode --model /path/to/llama --batch-sizes 1,4,16 --max-new-tokens 128
"""

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import torch

from eyas import SamplingParams, build_engine
from eyas.bench.record import add_out_argument, write_record
from eyas.testing.checkpoints import write_llama

# random checkpoint for the default run: big enough that compute, not only per-step overhead, shows
RANDOM_MODEL = dict(num_layers=8, hidden_size=256, intermediate_size=768, num_heads=8, num_kv_heads=4,
                    vocab_size=4096, max_position_embeddings=1024)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eyas.bench decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="Hugging Face Llama directory (default: a random checkpoint in a temp dir)")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated, e.g. 1,8")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32, help="prompt i of a batch has prompt_len + i tokens")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per side and batch size; best is kept")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per side and batch size")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for both sides (default: torch's); 1 is steadier on a busy machine")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts (and random checkpoint)")
    add_out_argument(p, "decode")
    return p.parse_args(argv)


def write_random_checkpoint(directory: Path, seed: int) -> Path:
    # no tokenizer: its BPE trainer stops far below vocab 4096 on the tiny corpus, and prompts are ids anyway
    return write_llama(directory, seed=seed, with_tokenizer=False, **RANDOM_MODEL)


def make_prompts(batch: int, prompt_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed * 1000 + batch)
    # unequal lengths so both sides handle ragged batches (left padding on the HF side); skip ids 0/1 (bos/eos)
    return [[rng.randrange(2, vocab_size) for _ in range(prompt_len + i)] for i in range(batch)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str):
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


def load_hf(path: str, device: str):
    from transformers import LlamaForCausalLM

    try:
        model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    except TypeError:  # transformers < 4.56 only knows `torch_dtype`
        model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None  # never stop early: exactly max_new_tokens per row
    model.generation_config.pad_token_id = 0
    return model


def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, device: str) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    # left padding with id 0: [B, width] ids and mask (1 = real token)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             use_cache=True)
    return out[:, width:].tolist()  # [B, max_new_tokens] generated ids only


def eyas_generate(eng, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]


def bench_pair(fns: dict, tokens: int, warmup: int, repeats: int, device: str) -> dict:
    # warm every side up, then alternate timed runs so background load hits both sides alike
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    best, outs = {k: float("inf") for k in fns}, {}
    for _ in range(repeats):
        for name, fn in fns.items():
            seconds, outs[name] = timed(fn, device)
            best[name] = min(best[name], seconds)
    return {k: (tokens / best[k], outs[k]) for k in fns}


def agreement(a: list[list[int]], b: list[list[int]]) -> str:
    # rows of equal length (asserted by the caller); report the earliest position where any row differs
    same = sum(x == y for x, y in zip(a, b))
    if same == len(a):
        return f"{same}/{len(a)} rows identical"
    first = min(next(i for i, (s, t) in enumerate(zip(x, y)) if s != t) for x, y in zip(a, b) if x != y)
    return f"{same}/{len(a)} rows identical (earliest divergence at new token {first})"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    n = args.max_new_tokens
    tmp = None
    if args.model is None:
        tmp = tempfile.TemporaryDirectory(prefix="eyas_bench_")
        print(f"writing a random Llama checkpoint {RANDOM_MODEL} to {tmp.name}")
        model_path = str(write_random_checkpoint(Path(tmp.name), args.seed))
    else:
        model_path = args.model

    hf = load_hf(model_path, args.device)
    vocab_size = hf.config.vocab_size
    prompts = {b: make_prompts(b, args.prompt_len, vocab_size, args.seed) for b in batch_sizes}

    # size the KV pool and admission limits so every batch is admitted in its first step, as HF prefills it
    need = max(sum(len(p) + n for p in ps) for ps in prompts.values())
    prefill = max(sum(len(p) for p in ps) for ps in prompts.values())
    eng = build_engine(overrides=[
        "speculative=none", "draft=none", f"model.path={model_path}", "model.dtype=float32", "cache=small", f"device={args.device}",
        f"cache.max_total_tokens={max(4096, need)}", f"cache.max_running_requests={max(16, max(batch_sizes))}",
        f"cache.max_prefill_tokens={max(2048, prefill)}",
    ])

    print(f"device={args.device} torch threads={torch.get_num_threads()} dtype=float32 "
          f"max_new_tokens={n} prompt_len={args.prompt_len}(+i) warmup={args.warmup} "
          f"repeats={args.repeats} (best kept)")
    if hasattr(os, "getloadavg"):  # other work on the machine skews both sides, not always alike
        print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    rows = []
    try:
        for b in batch_sizes:
            ps, tokens = prompts[b], b * n
            res = bench_pair({"eyas": lambda: eyas_generate(eng, ps, n),
                              "hf": lambda: hf_generate(hf, ps, n, args.device)},
                             tokens, args.warmup, args.repeats, args.device)
            (eyas_tps, eyas_out), (hf_tps, hf_out) = res["eyas"], res["hf"]
            assert all(len(o) == n for o in eyas_out + hf_out), "a side generated fewer tokens than asked"
            rows.append((b, eyas_tps, hf_tps, agreement(eyas_out, hf_out)))
            print(f"  batch {b}: done")
    finally:
        eng.close()
        if tmp is not None:
            tmp.cleanup()

    print()
    print("Ratios below were measured in this run, on this machine; they do not transfer to other hardware.")
    print(f"{'batch':>5}  {'eyas tok/s':>11}  {'transformers tok/s':>18}  {'eyas/transformers':>17}  greedy agreement")
    for b, e, h, agree in rows:
        print(f"{b:>5}  {e:>11.1f}  {h:>18.1f}  {e / h:>17.2f}  {agree}")
    table = [{"batch": b, "eyas_tok_s": e, "transformers_tok_s": h, "ratio": e / h, "agreement": agree}
             for b, e, h, agree in rows]
    write_record(args.out, "decode", argv, table, {"model": args.model or "random", "rows": table})


if __name__ == "__main__":
    main()
