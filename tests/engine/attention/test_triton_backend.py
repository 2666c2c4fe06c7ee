"""The triton attention backend: against torch_native on random paged pools, end to end (greedy output
equals torch_native's token for token, plain and speculative), and its error without CUDA or the
interpreter.

On CPU the kernels run in the Triton interpreter (slow): the default end-to-end runs are a few short
prompts; the larger sweeps are marked slow.

Tolerances against torch_native: float32 atol = rtol = 1e-5; float16 atol = rtol = 2e-3 (both sides
round their float16 output; the kernels accumulate in float32).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import build_engine
from support.engines import PLAIN, PROMPTS, engine_overrides

from eyas import ConfigError, SamplingParams
from eyas.engine.attention.torch_native import TorchNativeBackend
from eyas.engine.attention.triton import TritonBackend
from eyas.engine.cache.kv_pool import PagedKVPool
from eyas.engine.forward_batch import ForwardBatch

REPO_ROOT = Path(__file__).resolve().parents[3]
DEVICE = torch.device("cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu")
TOLERANCES = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


# ---- the backend alone ----

class PagedCase:
    """Requests on shuffled pages of one pool; a twin pool so each backend writes its own copy."""

    def __init__(self, num_heads, num_kv_heads, head_dim, page_size, dtype, rows, max_lens, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = num_heads, num_kv_heads, head_dim, dtype
        pages_per_req = [-(-n // page_size) for n in max_lens]
        num_pages = sum(pages_per_req) + 2  # spare pages nobody owns
        order = torch.randperm(num_pages, generator=gen)
        self.table = torch.full((max(rows) + 2, max(max_lens) + page_size), -1, dtype=torch.int64)
        used = 0
        for row, n, num in zip(rows, max_lens, pages_per_req):
            slots = (order[used:used + num, None] * page_size + torch.arange(page_size)[None, :]).flatten()
            self.table[row, :n] = slots[:n]
            used += num
        self.table = self.table.to(DEVICE)
        self.rows = rows
        self.pools = [PagedKVPool(2, num_pages, page_size, num_kv_heads, head_dim, dtype, DEVICE) for _ in range(2)]
        for layer in range(2):  # every slot holds random KV, so an unwritten slot read by mistake shows
            k, v = torch.randn(2, num_pages * page_size, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
            for pool in self.pools:
                pool.k[layer][:pool.num_slots].copy_(k)
                pool.v[layer][:pool.num_slots].copy_(v)
        self.gen = gen

    def run(self, backends, prefix_lens, extend_lens, layer=1):
        """The same forward on both backends (each with its pool) -> their outputs [N, Hq, D]."""
        batch = ForwardBatch.from_tails(self.rows, [[0] * e for e in extend_lens], prefix_lens, self.table)
        n = sum(extend_lens)
        q = torch.randn(n, self.num_heads, self.head_dim, generator=self.gen).to(DEVICE, self.dtype)
        k, v = torch.randn(2, n, self.num_kv_heads, self.head_dim, generator=self.gen).to(DEVICE, self.dtype)
        outs = []
        for backend, pool in zip(backends, self.pools):
            batch.kv_pool = pool
            backend.init_forward_metadata(batch)
            outs.append(backend.forward(q, k, v, layer, batch))
        return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("page_size", [pytest.param(1, marks=pytest.mark.slow), 16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 4, 16), (8, 2, 80)], ids=["mha16", "gqa80"])
def test_mixed_then_decode_batches_match_torch_native(dtype, page_size, num_heads, num_kv_heads, head_dim):
    # a prefill, an extend over a prefix, a one-token extend inside an extend batch, a long prefix;
    # then every request decodes (the 300-token one over 3 KV splits)
    prefix_lens, extend_lens = [0, 13, 40, 291], [7, 5, 1, 3]
    case = PagedCase(num_heads, num_kv_heads, head_dim, page_size, dtype, rows=[3, 0, 5, 2],
                     max_lens=[p + e + 2 for p, e in zip(prefix_lens, extend_lens)])
    backends = [TorchNativeBackend(head_dim), TritonBackend(head_dim)]
    expected, got = case.run(backends, prefix_lens, extend_lens)
    assert not backends[1].metadata.is_decode
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, **TOLERANCES[dtype])

    prefix_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    expected, got = case.run(backends, prefix_lens, [1, 1, 1, 1])
    assert backends[1].metadata.is_decode and backends[1].metadata.num_kv_splits == 3
    torch.testing.assert_close(got, expected, **TOLERANCES[dtype])
    for layer in range(2):  # the new tokens' K/V landed in the same slots, nothing else changed
        torch.testing.assert_close(case.pools[1].k[layer], case.pools[0].k[layer], atol=0, rtol=0)
        torch.testing.assert_close(case.pools[1].v[layer], case.pools[0].v[layer], atol=0, rtol=0)


def test_decode_workspace_is_reused_and_grown_on_demand():
    case = PagedCase(4, 2, 16, 16, torch.float32, rows=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], max_lens=[20] * 10)
    backends = [TorchNativeBackend(16), TritonBackend(16)]
    triton_backend = backends[1]
    for num_requests, expect_new in ((10, True), (3, False), (10, False)):
        before = triton_backend._workspace
        case.rows = list(range(num_requests))
        expected, got = case.run(backends, [5] * num_requests, [1] * num_requests)
        torch.testing.assert_close(got, expected, **TOLERANCES[torch.float32])
        assert (triton_backend._workspace is not before) == expect_new
    assert triton_backend._workspace.partial_out.shape[0] >= 10


def test_custom_tree_mask_on_the_batch_is_used():
    # request 0: 4 new tokens after a 5-token prefix, tree 0 -> {1, 2}, 2 -> 3; request 1: a chain of 3, no prefix
    num_heads, num_kv_heads, head_dim = 4, 2, 16
    case = PagedCase(num_heads, num_kv_heads, head_dim, 16, torch.float32, rows=[1, 0], max_lens=[9, 3])
    trees = [torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool),
             torch.tril(torch.ones(3, 3, dtype=torch.bool))]
    batch = ForwardBatch.from_tails(case.rows, [[0] * 4, [0] * 3], [5, 0], case.table)
    batch.custom_mask = torch.cat([t.flatten() for t in trees]).to(DEVICE)
    batch.kv_pool = case.pools[1]
    q = torch.randn(7, num_heads, head_dim).to(DEVICE)
    k, v = torch.randn(2, 7, num_kv_heads, head_dim).to(DEVICE)
    backend = TritonBackend(head_dim)
    backend.init_forward_metadata(batch)
    got = backend.forward(q, k, v, 0, batch)
    group, offset = num_heads // num_kv_heads, 0
    for row, prefix, tree in zip(case.rows, [5, 0], trees):
        slots = case.table[row, :prefix + tree.shape[0]]
        keys = case.pools[1].k[0][slots].repeat_interleave(group, 1)  # [L, Hq, D]
        values = case.pools[1].v[0][slots].repeat_interleave(group, 1)
        visible = torch.cat([torch.ones(tree.shape[0], prefix, dtype=torch.bool), tree], dim=1).to(DEVICE)
        for j in range(tree.shape[0]):
            scores = torch.einsum("hd,lhd->hl", q[offset + j], keys) * head_dim ** -0.5
            scores = scores.masked_fill(~visible[j], float("-inf"))
            expected = torch.einsum("hl,lhd->hd", scores.softmax(-1), values)
            torch.testing.assert_close(got[offset + j], expected, atol=1e-5, rtol=1e-5)
        offset += tree.shape[0]


# ---- end to end: greedy output equals torch_native's ----

FAST_PROMPTS = PROMPTS[:2]  # two prompts, 8 tokens: by default the kernels run interpreted on the CPU
PARAMS = SamplingParams(max_new_tokens=8, ignore_eos=True)
SLOW_PARAMS = SamplingParams(max_new_tokens=28, ignore_eos=True)


def generate(overrides, prompts, params):
    with build_engine(overrides) as eng:
        outs = eng.generate(prompts, params)
        assert eng.scheduler.kv.all_free()
    return [o.token_ids for o in outs]


def test_plain_greedy_equals_torch_native(gqa_checkpoint, plain_reference):
    with build_engine(engine_overrides(gqa_checkpoint, "none", "attention=triton")) as eng:
        assert type(eng.worker.runner.attn_backend) is TritonBackend
        outs = [o.token_ids for o in eng.generate(FAST_PROMPTS, PARAMS)]
    assert outs == plain_reference(gqa_checkpoint, FAST_PROMPTS, PARAMS)


@pytest.mark.parametrize("kind,num_steps", [("eagle", 3), ("eagle3", 2)])
def test_speculative_greedy_equals_torch_native_plain(spec_pair, plain_reference, kind, num_steps):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, kind, "attention=triton", head=heads[kind], num_steps=num_steps)) as eng:
        head = eng.worker.drafter.head
        assert type(head.runner.attn_backend) is TritonBackend
        assert type(eng.worker.state.verify_backend) is TritonBackend
        assert all(type(b) is TritonBackend for b in eng.worker.state.draft_decode_backend.backends)
        outs = eng.generate(FAST_PROMPTS, PARAMS)
        assert eng.metrics()["mean_accept_length"] >= 1.0
    assert [o.token_ids for o in outs] == plain_reference(target, FAST_PROMPTS, PARAMS)


def test_triton_draft_backend_under_a_torch_native_target(spec_pair, plain_reference):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle", "speculative.draft_attention_backend=triton", head=heads["eagle"])
    with build_engine(overrides) as eng:
        assert type(eng.worker.drafter.head.runner.attn_backend) is TritonBackend
        assert type(eng.worker.state.verify_backend) is TorchNativeBackend
        outs = [o.token_ids for o in eng.generate(FAST_PROMPTS, PARAMS)]
    assert outs == plain_reference(target, FAST_PROMPTS, PARAMS)


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["gqa", "tied_llama3", "linear_bias"])
def test_plain_greedy_equals_torch_native_sweep(checkpoint, name, page_size):
    base = engine_overrides(checkpoint(name), "none", f"cache.page_size={page_size}")
    assert generate([*base, "attention=triton"], PROMPTS, SLOW_PARAMS) == generate(base, PROMPTS, SLOW_PARAMS)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["attention=triton"], ["attention=triton", "cache.page_size=1"],
                                   ["attention=triton", "speculative.attention_mode=decode"],
                                   ["speculative.draft_attention_backend=triton"],
                                   ["attention.decode_backend=triton"]],
                         ids=["triton", "triton_page1", "triton_decode_mode", "draft_triton", "draft_decode_triton"])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("num_steps", [1, 3, 5])
def test_speculative_greedy_equals_torch_native_plain_sweep(spec_pair, plain_reference, kind, num_steps, extra):
    target, heads = spec_pair
    overrides = engine_overrides(target, kind, *extra, head=heads[kind], num_steps=num_steps)
    assert generate(overrides, PROMPTS, SLOW_PARAMS) == plain_reference(target, PROMPTS, SLOW_PARAMS)


# ---- without CUDA or the interpreter ----

def test_without_cuda_or_interpreter_the_error_names_the_fix(monkeypatch, gqa_checkpoint):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError) as err:
        TritonBackend(16)
    message = str(err.value)
    assert "'triton'" in message and "CUDA" in message and "TRITON_INTERPRET=1" in message
    assert "torch_native" in message
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "attention=triton", "device=cpu"])


def test_gpu_check_without_cuda_says_so_and_succeeds():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gpu_check.py")], check=False, cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "no CUDA device: nothing to check" in result.stdout


def test_compiled_kernels_refuse_cpu_tensors_with_a_clear_error(monkeypatch):
    import eyas.engine.attention.triton as triton_backend

    # kernels imported (compiled) before TRITON_INTERPRET=1 was set, no CUDA: the constructor says so
    monkeypatch.setattr(triton_backend, "_defined_in_interpreter", lambda kernel: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ConfigError, match="defined before"):
        TritonBackend(16)
    # compiled kernels (a CUDA machine) given CPU tensors: refused before any launch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backend = TritonBackend(16)
    batch = ForwardBatch.from_tails([0], [[1, 2]], [0], torch.arange(8).view(1, 8))
    with pytest.raises(ConfigError, match="device=cuda"):
        backend.init_forward_metadata(batch)
