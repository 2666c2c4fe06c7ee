"""The inference layout of the weights and the CPU fast paths: each equals the plain computation it replaces."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file
from support import build_engine
from support.cache_root import cache_root_with_cpu_kernels
from support.engines import PLAIN, engine_overrides
from support.references import naive_attention
from torch import nn

from eyas import ConfigError, SamplingParams
from eyas.engine.attention.torch_native import TorchNativeBackend
from eyas.engine.cache.allocator import PageAllocator
from eyas.engine.cache.kv_pool import PagedKVPool
from eyas.engine.forward_batch import ForwardBatch
from eyas.engine.models import layout_choice, layout_store
from eyas.engine.models.config import load_model_config
from eyas.engine.models.fused_linear import LAYOUTS, FusedLinear
from eyas.engine.models.layout_choice import choose_layouts
from eyas.engine.models.loader import load_model
from eyas.engine.models.rope import RotaryEmbedding
from eyas.engine.models.row_invariance import exact_rows


@pytest.mark.parametrize("layout", ["transposed", "linear", "onednn", "blocked"])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_linear_equals_its_members(layout, bias):
    torch.manual_seed(0)
    members = [nn.Linear(24, n, bias=bias) for n in (16, 8, 8)]
    originals = [(m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone()) for m in members]
    fused = FusedLinear(members)
    x, residual = torch.randn(5, 24), torch.randn(5, 32)
    with torch.no_grad():
        expected = torch.cat([m(x) for m in members], dim=-1)
        fused.pack(layout)
        torch.testing.assert_close(fused(x), expected, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(fused(x, residual), expected + residual, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(fused(x[:1]), expected[:1], atol=1e-6, rtol=1e-6)  # a decode's one row
    if layout in ("onednn", "blocked"):  # its own blocked copy: the members' weights are released, shapes kept
        assert fused.kernel is not None and all(m.weight.is_meta and m.weight.shape == w.shape
                                                for m, (w, _) in zip(members, originals))
        return
    # the members keep the checkpoint's values, as views of the one packed tensor
    for m, (w, b) in zip(members, originals):
        assert torch.equal(m.weight, w) and m.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()
        assert b is None or torch.equal(m.bias, b)


@pytest.mark.parametrize("layout", ["transposed", "linear", "onednn", "blocked"])
def test_exact_rows_compute_each_row_as_it_is_alone(layout):
    # what makes a verify's logprobs a decode's bit for bit: under exact_rows every row of a call equals
    # that row's call alone (dense GEMMs run a row per call; oneDNN's was found row-invariant or does too)
    torch.manual_seed(0)
    fused = FusedLinear([nn.Linear(256, 768, bias=False)])
    x, residual = torch.randn(33, 256), torch.randn(33, 768)
    with torch.inference_mode():
        fused.pack(layout)
        alone = torch.cat([fused(x[i:i + 1], residual[i:i + 1]) for i in range(33)])
        with exact_rows():
            for rows in (2, 4, 8, 9, 33):
                assert torch.equal(fused(x[:rows], residual[:rows]), alone[:rows]), rows
        with exact_rows(False):
            torch.testing.assert_close(fused(x, residual), alone)


def test_unpacked_fused_linear_trains_its_members():
    members = [nn.Linear(6, 4), nn.Linear(6, 2)]
    FusedLinear(members)(torch.randn(3, 6)).sum().backward()
    assert all(m.weight.grad is not None for m in members)


def test_weight_layout_choices(gqa_checkpoint):
    shapes = {"qkv": (64, 128), "down": (128, 64)}
    assert choose_layouts(shapes, "linear", torch.float32, torch.device("cpu")) == {"qkv": "linear", "down": "linear"}
    assert set(choose_layouts(shapes, "auto", torch.float32, torch.device("cpu")).values()) <= {"linear", "transposed", "onednn", "blocked"}
    with pytest.raises(ConfigError, match="model.weight_layout must be one of .*auto.*transposed.*linear"):
        choose_layouts(shapes, "columns", torch.float32, torch.device("cpu"))
    with pytest.raises(ConfigError, match="model.weight_layout"):
        build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "model.weight_layout=columns"])


def test_auto_layouts_are_timed_once_per_machine_and_kept(tmp_path, monkeypatch):
    """The first process to time a shape records its choice on disk; a later one (here: the process's own
    choices forgotten) packs by the record without timing, and obeys a record it did not make."""
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(layout_choice, "_MEASURED", {})
    shapes = {"qkv": (64, 128), "down": (128, 64), "up": (64, 128)}
    cpu = torch.device("cpu")
    timed = []
    measure = layout_choice.measure_layout
    monkeypatch.setattr(layout_choice, "measure_layout", lambda *a, **k: timed.append(a[:2]) or measure(*a, **k))
    first = choose_layouts(shapes, "auto", torch.float32, cpu, model_bytes=1 << 20)
    assert first["qkv"] == first["up"] and sorted(timed) == [(64, 128), (128, 64)]  # each distinct shape once
    record = json.loads((tmp_path / layout_store.FILE_NAME).read_text())
    assert sorted(record.values()) == sorted([first["qkv"], first["down"]]) and all("|64x128|" in k or "|128x64|" in k
                                                                                    for k in record)

    def never(*args, **kwargs):
        raise AssertionError("a recorded shape was timed again")
    monkeypatch.setattr(layout_choice, "measure_layout", never)
    monkeypatch.setattr(layout_choice, "_MEASURED", {})  # a new process
    assert choose_layouts(shapes, "auto", torch.float32, cpu, model_bytes=1 << 20) == first
    other = {k: ("linear" if v != "linear" else "transposed") for k, v in record.items()}
    (tmp_path / layout_store.FILE_NAME).write_text(json.dumps(other))
    monkeypatch.setattr(layout_choice, "_MEASURED", {})
    chosen = choose_layouts(shapes, "auto", torch.float32, cpu, model_bytes=1 << 20)
    assert chosen != first and chosen["qkv"] == other[layout_choice.record_key((64, 128), torch.float32, cpu, 1 << 20)]


def test_a_second_process_packs_as_the_first_timed(tmp_path):
    script = """
import torch
from eyas.engine.models import layout_choice
timed = []
measure = layout_choice.measure_layout
layout_choice.measure_layout = lambda *a, **k: timed.append(a[:2]) or measure(*a, **k)
chosen = layout_choice.choose_layouts({"qkv": (64, 128), "down": (128, 64)}, "auto", torch.float32,
                                      torch.device("cpu"))
print(len(timed), chosen["qkv"], chosen["down"])
"""
    env = {**os.environ, "EYAS_CACHE_DIR": str(cache_root_with_cpu_kernels(tmp_path))}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]
    assert runs[0][0] == "2" and runs[1][0] == "0" and runs[0][1:] == runs[1][1:]


def test_processes_starting_together_time_a_shape_once(tmp_path):
    """Two processes that reach the layouts at once (each waits for the other to be ready): the second
    waits for the first's record."""
    script = """
import pathlib, sys, time
import torch
from eyas.engine.models import layout_choice
measure = layout_choice.measure_layout
def slow(*a, **k):
    time.sleep(1.0)  # long enough for the other process to reach the lock
    return measure(*a, **k)
layout_choice.measure_layout = lambda *a, **k: print("timed", flush=True) or slow(*a, **k)
ready = pathlib.Path(sys.argv[1])
(ready / sys.argv[2]).touch()
while len(list(ready.iterdir())) < 2:
    time.sleep(0.01)
print(layout_choice.choose_layouts({"qkv": (64, 128)}, "auto", torch.float32, torch.device("cpu"))["qkv"])
"""
    ready = tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "EYAS_CACHE_DIR": str(cache_root_with_cpu_kernels(tmp_path / "cache"))}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(ready), str(i)], env=env, stdout=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert sum(out.count("timed") for out in outs) == 1 and outs[0][-1] == outs[1][-1], outs


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"%s": "columns"}'])
def test_an_unreadable_or_foreign_layout_record_is_timed_again(tmp_path, monkeypatch, content):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(layout_choice, "_MEASURED", {})
    path = tmp_path / layout_store.FILE_NAME
    key = layout_choice.record_key((64, 128), torch.float32, torch.device("cpu"))
    path.write_text(content.replace("%s", key))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = choose_layouts({"qkv": (64, 128)}, "auto", torch.float32, torch.device("cpu"))
    assert chosen["qkv"] in LAYOUTS
    assert json.loads(path.read_text()) == {key: chosen["qkv"]}
    warned = any("timed again" in str(w.message) for w in caught)
    assert warned == (not content.startswith('{"'))  # a layout it does not know is timed again, silently


def test_an_unwritable_cache_keeps_layouts_per_process(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EYAS_CACHE_DIR", str(blocker / "eyas"))  # under a file: cannot be made
    monkeypatch.setattr(layout_choice, "_MEASURED", {})
    with pytest.warns(UserWarning, match="not kept across processes.*EYAS_CACHE_DIR"):
        chosen = choose_layouts({"qkv": (64, 128)}, "auto", torch.float32, torch.device("cpu"))
    assert chosen["qkv"] in LAYOUTS


@pytest.mark.parametrize("layout", ["transposed", "linear"])
def test_loaded_model_keeps_checkpoint_tensors(gqa_checkpoint, layout):
    model = load_model(gqa_checkpoint, weight_layout=layout)
    tensors = load_file(gqa_checkpoint / "model.safetensors")
    state = model.state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(state[name], tensor.float()), name
    assert model.model.layers[0].self_attn.qkv.layout == layout


@pytest.mark.parametrize("layout", ["transposed", "linear", "onednn", "blocked"])
def test_greedy_output_same_in_every_layout(gqa_checkpoint, layout):
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = [[5, 9, 2, 44], [17, 3, 3, 8, 120, 6]]
    outs = {}
    for name in ("auto", layout):
        with build_engine([*PLAIN, f"model.path={gqa_checkpoint}", f"model.weight_layout={name}"]) as eng:
            outs[name] = [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]
    assert outs["auto"] == outs[layout]


@pytest.mark.parametrize("layout", ["onednn", "blocked"])
def test_float32_cpu_layouts_are_refused_where_they_cannot_run(gqa_checkpoint, layout):
    with pytest.raises(ConfigError, match=f"model.weight_layout={layout} runs float32 weights.*bfloat16"):
        build_engine([*PLAIN, f"model.path={gqa_checkpoint}", f"model.weight_layout={layout}", "model.dtype=bfloat16"])


def fused_layouts(model) -> set:
    return {v.layout for m in model.modules() for v in vars(m).values() if isinstance(v, FusedLinear)}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["onednn", "blocked"])
@pytest.mark.parametrize("mode", ["compile", "aot"])
def test_graphs_run_the_packed_layouts_as_eager_does(gqa_checkpoint, tmp_path, mode, layout):
    """Compiled forwards take oneDNN's or the blocked weights as inputs and call their GEMM (aot: no
    fallback to compile), and decode as the eager forward does, one request and a batch."""
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = [[5, 9, 2, 44], [17, 3, 3, 8, 120, 6], [7] * 12]
    base = [*PLAIN, f"model.path={gqa_checkpoint}", f"model.weight_layout={layout}"]
    outs = {}
    for name in ("eager", mode):
        with build_engine([*base, f"graphs.mode={name}", f"graphs.cache_dir={tmp_path}"]) as eng:
            outs[name] = [[o.token_ids for o in eng.generate(prompt_token_ids=p, sampling=params)]
                          for p in (prompts[:1], prompts)]
            assert fused_layouts(eng.worker.runner.model) == {layout}
            if name != "eager":
                graph = eng.worker.graph
                assert graph.num_runs > 0
                if mode == "aot":  # run by packages, not by the compile fallback
                    assert all(f._fallback is None for f in graph._forwards.values())
                    assert list((tmp_path / "eyas-aot").glob("*.pt2"))
    assert outs[mode] == outs["eager"]


@pytest.mark.parametrize("shape", [dict(num_steps=3), dict(num_steps=3, topk=2, nodes=6)], ids=["chain", "tree"])
@pytest.mark.parametrize("algorithm", ["eagle", "eagle3"])
@pytest.mark.parametrize("layout", ["onednn", "blocked"])
def test_speculation_in_a_packed_layout_equals_its_plain_decoding(spec_pair, plain_reference, algorithm, shape, layout):
    target, heads = spec_pair
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompts = [[5, 9, 2, 44], [17, 3, 3, 8, 120, 6], [7] * 12]
    with build_engine(engine_overrides(target, algorithm, f"model.weight_layout={layout}", head=heads[algorithm],
                                       **shape)) as eng:
        assert fused_layouts(eng.worker.target_runner.model) == {layout}
        assert layout in fused_layouts(eng.worker.drafter.head.model)
        got = [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]
        accepted = eng.metrics()["mean_accept_length"]
    assert got == plain_reference(target, prompts, params, f"model.weight_layout={layout}")
    assert accepted > 1.2  # the drafts were taken, not all refused


def test_rope_tables_from_the_cache_equal_direct_ones(gqa_checkpoint):
    rotary = RotaryEmbedding(load_model_config(gqa_checkpoint))
    for positions in (torch.tensor([0, 5, 63]), torch.tensor([64, 300, 7, 129])):  # the second grows the cache
        cached = rotary.tables(positions, torch.float32, int(positions.max()))
        direct = rotary.tables(positions, torch.float32)
        assert torch.equal(cached.cos, direct.cos) and torch.equal(cached.signed_sin, direct.signed_sin)


def test_pages_are_handed_out_lowest_first_after_frees():
    allocator = PageAllocator(8)
    a, b, c = allocator.allocate(2), allocator.allocate(3), allocator.allocate(2)
    assert (a, b, c) == ([0, 1], [2, 3, 4], [5, 6])
    allocator.free(b)
    allocator.free(a)
    assert allocator.allocate(4) == [0, 1, 2, 3]  # a contiguous, ascending run again


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("prefix_len,extend_len", [(0, 9), (30, 1), (30, 4)])
def test_lone_request_attention(contiguous, prefix_len, extend_len):
    """A lone request reads its KV as a view (contiguous slots, stored by one copy) or gathers it
    (scattered slots): both equal attention written out by hand, prefill, decode and verify widths."""
    torch.manual_seed(1)
    num_heads, num_kv_heads, head_dim, total = 4, 2, 16, prefix_len + extend_len
    pool = PagedKVPool(1, 64, 1, num_kv_heads, head_dim, torch.float32, torch.device("cpu"))
    table = torch.full((2, 48), -1, dtype=torch.int64)
    table[1, :total] = torch.arange(7, 7 + total) if contiguous else torch.randperm(64)[:total]
    full_k, full_v = torch.randn(total, num_kv_heads, head_dim), torch.randn(total, num_kv_heads, head_dim)
    pool.store(0, table[1, :prefix_len], full_k[:prefix_len], full_v[:prefix_len])
    batch = ForwardBatch.from_tails([1], [[3] * extend_len], [prefix_len], table)
    batch.kv_pool = pool
    backend = TorchNativeBackend(head_dim)
    backend.init_forward_metadata(batch)
    assert (backend.metadata.kv_range is not None) == contiguous
    q = torch.randn(extend_len, num_heads, head_dim)
    out = backend.forward(q, full_k[prefix_len:], full_v[prefix_len:], 0, batch)
    expected = naive_attention(q, full_k, full_v, range(prefix_len, total), head_dim ** -0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool.k[0][table[1, :total]], full_k)
    torch.testing.assert_close(pool.v[0][table[1, :total]], full_v)


def test_num_threads_is_applied_and_checked(gqa_checkpoint):
    before = torch.get_num_threads()
    try:
        with build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "num_threads=1"]):
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="num_threads must be an integer >= 1"):
        build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "num_threads=0"])


@pytest.mark.parametrize("hidden_size", [64, 96])
def test_rms_norm_is_hugging_face_s(hidden_size):
    """Bit for bit Hugging Face's formula, on both of its paths (power-of-two width or not), in float32
    and through the float32 upcast of half precision."""
    from eyas.engine.models.llama import RMSNorm

    torch.manual_seed(2)
    norm = RMSNorm(hidden_size, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden_size))
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(7, hidden_size) * 3).to(dtype)
        h = x.float()
        expected = norm.weight.to(dtype) * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
        assert torch.equal(norm.to(dtype)(x), expected), dtype
        norm.float()


def test_unpacked_model_trains(gqa_checkpoint):
    """Training builds the modules unpacked: one forward, every parameter gets a gradient."""
    from eyas.engine.attention.dense import dense_batch, dense_positions
    from eyas.engine.models.llama import LlamaForCausalLM

    model = LlamaForCausalLM(load_model_config(gqa_checkpoint))
    ids = torch.randint(0, model.config.vocab_size, (2 * 9,))
    hidden, _ = model(ids, dense_positions(2, 9, "cpu"), dense_batch(2, 9))
    model.compute_logits(hidden).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
