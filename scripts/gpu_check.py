"""GPU check of the Triton kernels: their tests compiled for CUDA, then a micro-benchmark against torch.

1. Runs the kernel tests and tests/engine/attention/test_triton_backend.py in a pytest subprocess with
   TRITON_INTERPRET=0, so every kernel is compiled for the GPU instead of interpreted.
2. Times each attention kernel against a torch baseline, on a paged KV cache (page size 16, pages
   in shuffled order), 32 query heads, 8 KV heads, head dim 128, float16 and bfloat16:
   - decode_attention (one query per request) vs SDPA over the same KV held dense, and vs the
     torch_native path (gather the pages, then SDPA);
   - extend_attention: verify (4 new tokens after a long prefix) and prefill (causal, no prefix) vs
     SDPA over dense KV;
   - store_kv vs indexed assignment `cache[slots] = k`.
   Each line prints the kernel's median time, its achieved bandwidth (bytes of KV read + written,
   plus q and output, over time; extend also TFLOP/s) and `x` = baseline time / kernel time measured
   in this run (> 1: the kernel is faster), and the largest difference from the baseline's output.

Without a CUDA device it prints that there is nothing to check and exits 0.

    python scripts/gpu_check.py                  # tests, then benchmark
    python scripts/gpu_check.py --slow           # the slow tests too
    python scripts/gpu_check.py --skip-tests     # benchmark only
    python scripts/gpu_check.py --autotune       # benchmark with EYAS_TRITON_AUTOTUNE=1
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
NO_CUDA = "no CUDA device: nothing to check; the kernels are tested on CPU under TRITON_INTERPRET=1 by pytest"
TESTS = ["tests/kernels/test_kernel_store_kv.py", "tests/kernels/test_kernel_decode_attention.py",
         "tests/kernels/test_kernel_extend_attention.py", "tests/kernels/test_kernel_verify_greedy.py",
         "tests/engine/attention/test_triton_backend.py"]
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
VERIFY_TOKENS = 4
DEVICE = "cuda"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-tests", action="store_true", help="only the benchmark")
    p.add_argument("--skip-bench", action="store_true", help="only the tests")
    p.add_argument("--slow", action="store_true", help="also run the tests marked slow")
    p.add_argument("--tests", nargs="+", default=TESTS, help="test files to run on the GPU")
    p.add_argument("--autotune", action="store_true", help="benchmark with EYAS_TRITON_AUTOTUNE=1")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--contexts", default="1024,4096")
    return p.parse_args()


def run_tests(files: list[str], slow: bool) -> bool:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    cmd = [sys.executable, "-m", "pytest", "-q", *files]
    if slow:
        cmd += ["-m", "slow or not slow"]
    print("$ TRITON_INTERPRET=0 " + " ".join(cmd[1:]), flush=True)
    return subprocess.run(cmd, check=False, cwd=REPO_ROOT, env=env).returncode == 0


# ---- benchmark ----

def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def paged_kv(batch: int, context: int, dtype: torch.dtype, gen: torch.Generator):
    """(k_cache, v_cache [S, Hkv, D], table [B, C] int64): each request's pages in shuffled order."""
    pages_per_req = -(-context // PAGE_SIZE)
    num_pages = batch * pages_per_req
    order = torch.randperm(num_pages, generator=gen, device=DEVICE)
    slots = order.view(batch, pages_per_req, 1) * PAGE_SIZE + torch.arange(PAGE_SIZE, device=DEVICE)
    table = slots.view(batch, -1)[:, :context].contiguous()
    shape = (num_pages * PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen, device=DEVICE).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=DEVICE).to(dtype)
    return k_cache, v_cache, table


def dense(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return cache[table].transpose(1, 2).contiguous()  # [B, Hkv, C, D]


def sdpa(q, k, v, **kwargs):
    # q: [B, Hq, M, D]; k, v: [B, Hkv, L, D]
    from torch.nn import functional as F

    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=HEAD_DIM ** -0.5, **kwargs)


def report(kind: str, dtype: torch.dtype, shape: str, ms: float, num_bytes: int, baselines: dict, max_diff: float,
           flops: int | None = None):
    dtype_name = str(dtype).removeprefix("torch.")
    line = f"{kind:<8} {dtype_name:<9} {shape:<22} {ms * 1e3:9.1f} us {num_bytes / ms / 1e6:8.0f} GB/s"
    if flops is not None:
        line += f" {flops / ms / 1e9:6.1f} TFLOP/s"
    for name, base_ms in baselines.items():
        line += f" | {name} {base_ms * 1e3:9.1f} us x{base_ms / ms:5.2f}"
    print(line + f" | max diff {max_diff:.1e}", flush=True)


def bench_decode(dtype, batch: int, context: int, gen):
    from eyas.engine.attention.triton import TritonBackend
    from eyas.kernels.decode_attention import decode_attention, decode_workspace

    k_cache, v_cache, table = paged_kv(batch, context, dtype, gen)
    rows = torch.arange(batch, device=DEVICE)
    seq_lens = torch.full((batch,), context, dtype=torch.int64, device=DEVICE)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, generator=gen, device=DEVICE).to(dtype)
    out = torch.empty_like(q)
    splits = TritonBackend.num_kv_splits(context)
    workspace = decode_workspace(batch, NUM_HEADS, splits, HEAD_DIM, DEVICE)

    def kernel():
        decode_attention(q, k_cache, v_cache, table, rows, seq_lens, out, HEAD_DIM ** -0.5, num_kv_splits=splits,
                         workspace=workspace)

    k_dense, v_dense = dense(k_cache, table), dense(v_cache, table)
    expected = sdpa(q[:, :, None], k_dense, v_dense)[:, :, 0]
    kernel()
    baselines = {
        "sdpa": bench_ms(lambda: sdpa(q[:, :, None], k_dense, v_dense)),
        # what the torch_native backend does: gather the pages, then SDPA
        "gather+sdpa": bench_ms(lambda: sdpa(q[:, :, None], k_cache[table].transpose(1, 2),
                                             v_cache[table].transpose(1, 2))),
    }
    num_bytes = (2 * batch * context * NUM_KV_HEADS + 2 * batch * NUM_HEADS) * HEAD_DIM * k_cache.element_size()
    report("decode", dtype, f"B={batch} ctx={context}", bench_ms(kernel), num_bytes, baselines,
           (out.float() - expected.float()).abs().max().item())


def bench_extend(dtype, batch: int, prefix: int, extend: int, gen):
    from eyas.kernels.extend_attention import extend_attention

    k_cache, v_cache, table = paged_kv(batch, prefix + extend, dtype, gen)
    as_index = dict(dtype=torch.int64, device=DEVICE)
    rows = torch.arange(batch, device=DEVICE)
    prefix_lens, extend_lens = torch.full((batch,), prefix, **as_index), torch.full((batch,), extend, **as_index)
    extend_starts = torch.arange(batch, **as_index) * extend
    q = torch.randn(batch * extend, NUM_HEADS, HEAD_DIM, generator=gen, device=DEVICE).to(dtype)
    out = torch.empty_like(q)

    def kernel():
        extend_attention(q, k_cache, v_cache, table, rows, prefix_lens, extend_lens, extend_starts, out,
                         HEAD_DIM ** -0.5, extend)

    k_dense, v_dense = dense(k_cache, table), dense(v_cache, table)
    q_dense = q.view(batch, extend, NUM_HEADS, HEAD_DIM).transpose(1, 2)  # [B, Hq, E, D]
    if prefix == 0:
        def baseline():
            return sdpa(q_dense, k_dense, v_dense, is_causal=True)
    else:
        positions = torch.arange(prefix + extend, device=DEVICE)
        mask = positions[None, :] <= prefix + torch.arange(extend, device=DEVICE)[:, None]  # [E, L]

        def baseline():
            return sdpa(q_dense, k_dense, v_dense, attn_mask=mask)
    expected = baseline().transpose(1, 2).reshape(out.shape)
    kernel()
    visible = batch * (extend * prefix + extend * (extend + 1) // 2)  # (query, key) pairs per head
    flops = 4 * visible * NUM_HEADS * HEAD_DIM
    num_bytes = (2 * batch * (prefix + extend) * NUM_KV_HEADS + 2 * batch * extend * NUM_HEADS) * HEAD_DIM \
        * k_cache.element_size()
    report("verify" if prefix else "prefill", dtype, f"B={batch} ctx={prefix}+{extend}", bench_ms(kernel), num_bytes,
           {"sdpa": bench_ms(baseline)}, (out.float() - expected.float()).abs().max().item(), flops)


def bench_store_kv(dtype, num_tokens: int, gen):
    from eyas.kernels.store_kv import store_kv

    num_slots = 4 * num_tokens
    k_cache = torch.zeros(num_slots, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k, v = torch.randn(2, num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen, device=DEVICE).to(dtype)
    slots = torch.randperm(num_slots, generator=gen, device=DEVICE)[:num_tokens]

    def baseline():
        k_cache[slots] = k
        v_cache[slots] = v

    baseline()
    expected = k_cache.clone()
    k_cache.zero_()
    store_kv(k_cache, v_cache, k, v, slots)
    max_diff = (k_cache.float() - expected.float()).abs().max().item()
    num_bytes = 4 * num_tokens * NUM_KV_HEADS * HEAD_DIM * k.element_size()  # read k, v; write both
    report("store_kv", dtype, f"N={num_tokens}", bench_ms(lambda: store_kv(k_cache, v_cache, k, v, slots)), num_bytes,
           {"index_put": bench_ms(baseline)}, max_diff)


def benchmark(batch_sizes: list[int], contexts: list[int]) -> None:
    print(f"\n{torch.cuda.get_device_name()}: Hq={NUM_HEADS} Hkv={NUM_KV_HEADS} D={HEAD_DIM} page={PAGE_SIZE}; "
          "x = baseline time / kernel time, measured in this run", flush=True)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        for batch in batch_sizes:
            for context in contexts:
                bench_decode(dtype, batch, context, gen)
        for batch in batch_sizes:
            for context in contexts:
                bench_extend(dtype, batch, context, VERIFY_TOKENS, gen)
        for context in contexts:
            bench_extend(dtype, 1, 0, context, gen)
        for num_tokens in (max(batch_sizes), 4096):
            bench_store_kv(dtype, num_tokens, gen)


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    # Triton reads these when a kernel is defined: before anything imports kernels/
    os.environ["TRITON_INTERPRET"] = "0"
    os.environ["EYAS_TRITON_AUTOTUNE"] = "1" if args.autotune else os.environ.get("EYAS_TRITON_AUTOTUNE", "0")
    tests_ok = True
    if not args.skip_tests:
        tests_ok = run_tests(args.tests, args.slow)
    if not args.skip_bench:
        benchmark([int(b) for b in args.batch_sizes.split(",")], [int(c) for c in args.contexts.split(",")])
    if not tests_ok:
        print("\nGPU tests FAILED (see above)")
    return 0 if tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
