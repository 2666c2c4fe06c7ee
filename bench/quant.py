"""Weight formats measured: decode speed at a real model's shape, and what each format costs in quality.

Speed (`--parts speed`): a random Llama of Qwen2.5-0.5B's body shape (24 layers, width 896, 14 heads,
2 KV heads, MLP 4864; vocabulary 4096, the shipped tokenizer's), written here with transformers, is
decoded greedily by eyas in each weight format and by CTranslate2 int8 converted from the same
checkpoint, all in one process, interleaved wave by wave (`bench_peers.bench_batch`): the same held-out
prompt ids, exactly `--max-new-tokens` new tokens each, prefill included. CTranslate2 runs on one
thread by default (`--ct2-threads`): with two, its OpenMP runtime slowed torch's in the same process. Each eyas row's greedy ids
are compared with eyas float32's (a random model's near-ties make some divergence expected) and the
n-gram row's with its own format's plain decoding (it must be identical).

Quality (`--parts quality`): the shipped target in each format: held-out loss (nats/token over windows
of the held-out standard-library files), greedy agreement with float32 on held-out prompts, and the
shipped EAGLE-3 head's tau on it, with its output checked against plain decoding of that format.

    python -m eyas.bench quant                                    # both parts, batch 1
    python -m eyas.bench quant --parts speed --systems float32,int8,ct2_int8 --batch-sizes 1,8
    python -m eyas.bench quant --layers 2 --hidden-size 128 --intermediate-size 256 --max-new-tokens 8

Systems (`--systems`): float32, bfloat16_dense (bf16 weights, the dense bf16 GEMM: `weight_layout=linear`),
bfloat16 (bf16 model, `auto` layout: float16 weights in fbgemm's GEMM), int8, int4 (`model.quantization`),
int8_ngram (int8 target, n-gram drafter), ct2_int8, ct2_float32. Needs the optional packages: pip
install '.[bench]'.
"""

import argparse
import math
import os
import tempfile
from pathlib import Path

import torch
from torch.nn import functional as F

from eyas import SamplingParams
from eyas.bench.decode import agreement
from eyas.bench.peers import EyasRunner, bench_batch, ct2_generate, load_ct2, make_waves, optional
from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.target import build_engine
from eyas.engine.assets import asset_path, heldout_files
from eyas.engine.attention.dense import dense_batch, dense_positions
from eyas.engine.models.loader import load_model
from eyas.engine.tokenizer import Tokenizer
from eyas.prompts.heldout import heldout_prompts

# system -> engine overrides (eyas) or CTranslate2 compute type
EYAS = {
    "float32": ["model.dtype=float32"],
    "bfloat16_dense": ["model.dtype=bfloat16", "model.weight_layout=linear"],
    "bfloat16": ["model.dtype=bfloat16"],
    "int8": ["model.dtype=float32", "model.quantization=int8"],
    "int4": ["model.dtype=float32", "model.quantization=int4"],
    "int8_ngram": ["model.dtype=float32", "model.quantization=int8", "speculative=ngram", "adaptive=off"],
}
CT2 = {"ct2_int8": "int8", "ct2_float32": "float32"}
LABELS = {"float32": "eyas float32", "bfloat16_dense": "eyas bfloat16, dense bf16 GEMM",
          "bfloat16": "eyas bfloat16 (fp16 weights)", "int8": "eyas int8", "int4": "eyas int4 (group 128)",
          "int8_ngram": "eyas int8, n-gram drafter", "ct2_int8": "CTranslate2 int8", "ct2_float32": "CTranslate2 float32"}
# quality part: the shipped target's formats, as (dtype, quantization)
FORMATS = {"float32": ("float32", "none"), "bfloat16": ("bfloat16", "none"), "int8": ("float32", "int8"),
           "int4": ("float32", "int4")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eyas.bench quant", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="speed,quality", help="comma-separated: speed, quality")
    p.add_argument("--systems", default="float32,bfloat16_dense,bfloat16,int8,int4,int8_ngram,ct2_int8",
                   help=f"comma-separated subset of {','.join([*EYAS, *CT2])}")
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=2, help="prompts per wave, rounded up to whole batches")
    p.add_argument("--rounds", type=int, default=2, help="timed waves per batch size")
    # CTranslate2 brings its own OpenMP runtime: after it runs with 2 threads, torch's fbgemm GEMMs in the
    # same process ran 1.3-1.8x slower here (its 2 threads timed 10% faster than 1 for itself)
    p.add_argument("--ct2-threads", type=int, default=1,
                   help="ct2 intra_threads (default 1: see above; 0: the fastest, timed at start)")
    p.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint to time instead of the random one")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden-size", type=int, default=896)
    p.add_argument("--intermediate-size", type=int, default=4864)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--loss-windows", type=int, default=64, help="quality: held-out windows of 256 tokens")
    p.add_argument("--quality-prompts", type=int, default=8)
    add_out_argument(p, "quant")
    args = p.parse_args(argv)
    args.parts = args.parts.split(",")
    args.systems = args.systems.split(",")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    unknown = [s for s in args.systems if s not in EYAS and s not in CT2]
    if unknown or not set(args.parts) <= {"speed", "quality"}:
        p.error(f"unknown systems {unknown} (allowed: {[*EYAS, *CT2]}) or parts {args.parts} (allowed: speed, quality)")
    return args


def write_checkpoint(args, directory: Path) -> Path:
    from eyas.testing.checkpoints import write_llama

    optional("transformers")
    print(f"writing a random checkpoint: {args.layers} layers, width {args.hidden_size}, {args.heads} heads, "
          f"{args.kv_heads} KV heads, MLP {args.intermediate_size}, vocab 4096")
    return write_llama(directory, vocab_size=4096, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                       num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads, init_std=0.02,
                       max_position_embeddings=4096)


def parameter_count(checkpoint: Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def speed(args, tmp: str) -> list[dict]:
    n = args.max_new_tokens
    checkpoint = args.checkpoint or write_checkpoint(args, Path(tmp) / "model")
    print(f"{parameter_count(checkpoint) / 1e6:.0f}M parameters")
    tok = Tokenizer.from_dir(asset_path("target"))
    per_wave = max(b * math.ceil(args.num_prompts / b) for b in args.batch_sizes)
    pool = [tok.encode(t) for t in heldout_prompts(per_wave * (args.rounds + 1))]
    batch, longest = max(args.batch_sizes), max(len(p) for p in pool)
    cache = [f"cache.max_running_requests={batch}", f"cache.max_prefill_tokens={batch * longest}",
             f"cache.max_total_tokens={batch * (longest + n + 48)}"]
    runners, engines = {}, []
    for name in args.systems:
        if name in CT2:
            generator, vocab, threads = load_ct2(str(checkpoint), os.path.join(tmp, name), args.ct2_threads, pool[0],
                                                 CT2[name])
            print(f"{LABELS[name]}: intra_threads {threads}")
            runners[name] = lambda ps, g=generator, v=vocab: ct2_generate(g, v, ps, n)
        else:
            eng = build_engine(overrides=["device=cpu", f"model.path={checkpoint}", "speculative=none", "draft=none",
                                          *EYAS[name], *cache])
            engines.append(eng)
            runners[name] = EyasRunner(eng, n)
    rows = []
    try:
        for b in args.batch_sizes:
            res = bench_batch(runners, make_waves(pool, b, args.num_prompts, args.rounds), n)
            base = res.get("float32")
            for name in args.systems:
                tps, out = res[name]
                ref = res.get("int8" if name == "int8_ngram" else "float32")
                rows.append(dict(batch=b, system=LABELS[name], tok_s=tps,
                                 vs_float32=tps / base[0] if base else None,
                                 vs_ct2_int8=tps / res["ct2_int8"][0] if "ct2_int8" in res else None,
                                 greedy_ids=("reference" if name == "float32" else
                                             agreement(out, ref[1]) + (" vs eyas int8" if name == "int8_ngram" else
                                                                       " vs eyas float32") if ref else "n/a")))
    finally:
        for eng in engines:
            eng.close()
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    print("\n| batch | system | tok/s | / eyas float32 | / CTranslate2 int8 | greedy ids |\n| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['system']} | {r['tok_s']:.1f} | {fmt(r['vs_float32'])} | {fmt(r['vs_ct2_int8'])} "
              f"| {r['greedy_ids']} |")
    return rows


def heldout_windows(tok: Tokenizer, count: int, length: int = 256) -> torch.Tensor:
    """[count, length + 1] token windows cut end to end from the held-out standard-library files."""
    import sysconfig

    root, ids = Path(sysconfig.get_paths()["stdlib"]), []
    for rel in heldout_files():
        if (root / rel).is_file():
            ids.extend(tok.encode((root / rel).read_text(encoding="utf-8", errors="replace")))
    stream = torch.tensor(ids[:count * (length + 1)])
    return stream[:len(stream) // (length + 1) * (length + 1)].view(-1, length + 1)


@torch.inference_mode()
def heldout_loss(model, windows: torch.Tensor, batch_size: int = 8) -> float:
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        w = windows[i:i + batch_size]
        b, t = w.shape[0], w.shape[1] - 1
        inputs, targets = w[:, :-1].reshape(-1), w[:, 1:].reshape(-1)
        hidden, _ = model(inputs, dense_positions(b, t, inputs.device), dense_batch(b, t))
        total += float(F.cross_entropy(model.compute_logits(hidden), targets, reduction="sum"))
        count += targets.numel()
    return total / count


def quality(args) -> list[dict]:
    target = asset_path("target")
    tok = Tokenizer.from_dir(target)
    windows = heldout_windows(tok, args.loss_windows)
    prompts = [tok.encode(t) for t in heldout_prompts(args.quality_prompts)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, ignore_eos=True)
    rows, reference = [], None
    print(f"\nshipped target: held-out loss over {len(windows)} windows of 256 tokens; greedy on "
          f"{len(prompts)} held-out prompts, {args.max_new_tokens} new tokens")
    for name, (dtype, quantization) in FORMATS.items():
        loss = heldout_loss(load_model(target, dtype, quantization=quantization), windows)
        fmt = [f"model.dtype={dtype}", f"model.quantization={quantization}"]
        with build_engine(["device=cpu", "speculative=none", "draft=none", *fmt]) as eng:
            plain = [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]
        with build_engine(["device=cpu", "adaptive=off", "speculative.num_steps=5", *fmt]) as eng:
            spec = [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]
            tau = eng.metrics()["mean_accept_length"]
        reference = reference or (loss, plain)
        same = sum(a == b for row, ref in zip(plain, reference[1]) for a, b in zip(row, ref))
        prefix = [next((i for i, (a, b) in enumerate(zip(row, ref)) if a != b), len(row))
                  for row, ref in zip(plain, reference[1])]
        rows.append(dict(format=name, heldout_loss=loss, loss_vs_float32=loss / reference[0] - 1,
                         greedy_positions_equal_float32=same / sum(map(len, plain)),
                         mean_tokens_before_divergence=sum(prefix) / len(prefix),
                         eagle3_k5_tau=tau, eagle3_equals_plain=spec == plain))
    print("\n| format | held-out loss | vs float32 | greedy positions = float32 | tokens before divergence (mean) "
          "| EAGLE-3 k=5 tau | EAGLE-3 = plain of that format |\n| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['format']} | {r['heldout_loss']:.4f} | {100 * r['loss_vs_float32']:+.2f}% "
              f"| {100 * r['greedy_positions_equal_float32']:.1f}% | {r['mean_tokens_before_divergence']:.1f} "
              f"| {r['eagle3_k5_tau']:.2f} | {'yes' if r['eagle3_equals_plain'] else 'NO'} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"threads: torch {torch.get_num_threads()}; load average at start: "
          f"{' '.join(f'{x:.2f}' for x in load) if load else '-'} on {os.cpu_count()} cpus")
    result = dict(threads=torch.get_num_threads(), max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                  num_prompts=args.num_prompts, load_average_at_start=load)
    with tempfile.TemporaryDirectory(prefix="bench_quant_") as tmp:
        if "speed" in args.parts:
            result["speed"] = speed(args, tmp)
    if "quality" in args.parts:
        result["quality"] = quality(args)
    print("\nRatios were measured in this run, on this machine; they do not transfer to other hardware.")
    table = [{"part": part, **scalars(r)} for part in ("speed", "quality") for r in result.get(part, [])]
    write_record(args.out, "quant", argv, table, result)


if __name__ == "__main__":
    main()
