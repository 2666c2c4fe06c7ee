"""Weights stored in fewer bytes (`engine/models/weight_formats.py`): the int8, int4 and fp16 kernels
(row-invariant, close to the float GEMM), `load_model` and `FusedLinear.pack` with them (float weights
released, a tied embedding kept), their config errors as a user types them, speculation over a quantized
target (and with a quantized draft) equal to plain decoding of that same quantized target for every
drafter, the command line, and the `fp16` layout of a bfloat16 model on CPU."""

import json
import re

import pytest
import torch
from support import build_engine, run_cli
from support.engines import GRAPHS, PARAMS_16, PLAIN, PROMPTS, PROMPTS_16, REPEATING_PROMPTS, engine_overrides
from torch import nn
from torch.nn import functional as F

from eyas import ConfigError, SamplingParams
from eyas.engine.attention.dense import dense_batch, dense_positions
from eyas.engine.models.fused_linear import FusedLinear
from eyas.engine.models.loader import load_model
from eyas.engine.models.weight_formats import (INT4_GROUP_SIZES, SCHEMES, Fp16Weights, Int4Weights, Int8Weights,
                                          Quantization, check_int4_shapes, check_quantization)

# kernel name -> (constructor over (weight [out, in], bias), bound on the relative error against F.linear)
KERNELS = {
    "int8": (lambda w, b: Int8Weights(w, b), 0.05),
    "int4": (lambda w, b: Int4Weights(w, b, 32), 0.15),
    "fp16": (lambda w, b: Fp16Weights(w, b), 1e-3),
}
KERNEL_SHAPES = [(64, 48), (96, 160), (64, 160), (96, 48)]  # (in, out): int4 needs in % 32 == 0, out % 16 == 0
SUBSETS = [[0], [6], [0, 6], [1, 2, 3], [5, 3, 0, 4], [6, 5, 4, 3, 2, 1], [2, 2, 2]]

# the overrides of a quantized target: int4 in groups the 64-wide fixtures split into
QUANT = {"none": (), "int8": ("model.quantization=int8",),
         "int4": ("model.quantization=int4", "model.quantization_group_size=32"),
         "q8_0": ("model.quantization=q8_0",)}
QUANTIZATION = {"int8": Quantization("int8"), "int4": Quantization("int4", 32)}
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


def weights(fan_in: int, fan_out: int, bias: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(fan_out, fan_in, generator=gen) * 0.2
    b = torch.randn(fan_out, generator=gen) if bias else None
    return w, b


def rows(n: int, fan_in: int, seed: int) -> torch.Tensor:
    """[n, in] rows of very different magnitudes (a per-tensor activation scale would couple them)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, fan_in, generator=gen) * torch.logspace(-2, 2, n)[:, None]


# --- the kernels ---

def assert_row_invariant(kernel, x: torch.Tensor, where: str = "") -> None:
    """Every row's output is the same bits whatever other rows share the call."""
    full = kernel(x)
    for i in range(len(x)):
        assert torch.equal(kernel(x[i:i + 1])[0], full[i]), f"{where}: row {i} alone"
    for subset in SUBSETS:
        assert torch.equal(kernel(x[subset]), full[subset]), f"{where}: rows {subset}"
    # beside rows a hundred times larger, and with the call's rows in reverse order
    crowd = torch.cat((x, 100 * rows(9, x.shape[1], seed=99).to(x.dtype)))
    assert torch.equal(kernel(crowd)[:len(x)], full), f"{where}: beside larger rows"
    assert torch.equal(kernel(x.flip(0)), full.flip(0)), f"{where}: reversed"


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_quantized_kernels_are_row_invariant_and_close_to_the_float_gemm(name, shape, bias):
    fan_in, fan_out = shape
    make, bound = KERNELS[name]
    w, b = weights(fan_in, fan_out, bias, seed=fan_in + fan_out)
    kernel = make(w, b)
    x = rows(7, fan_in, seed=fan_out)
    out = kernel(x)
    assert out.shape == (7, fan_out) and out.dtype == torch.float32
    assert relative_error(out, F.linear(x, w, b)) < bound
    for i in range(7):  # each row near its own reference, whatever its magnitude
        assert relative_error(out[i], F.linear(x[i], w, b)) < 2 * bound, i
    assert_row_invariant(kernel, x)
    xb = x.bfloat16()
    outb = kernel(xb)
    assert outb.dtype == torch.bfloat16 and outb.shape == (7, fan_out)
    assert relative_error(outb, F.linear(xb.float(), w, b)) < bound + 0.02
    assert_row_invariant(kernel, xb)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fp16_kernel_is_close_to_the_float_gemm(shape, bias):
    fan_in, fan_out = shape
    make, bound = KERNELS["fp16"]
    w, b = weights(fan_in, fan_out, bias, seed=fan_in + fan_out)
    w = w.bfloat16().float()  # the weights it is used for: a bfloat16 model's, exact in float16
    kernel = make(w, b)
    x = rows(7, fan_in, seed=fan_out)
    out = kernel(x)
    assert out.shape == (7, fan_out) and out.dtype == torch.float32
    assert relative_error(out, F.linear(x, w, b)) < bound
    outb = kernel(x.bfloat16())
    assert outb.dtype == torch.bfloat16
    assert relative_error(outb, F.linear(x.bfloat16().float(), w, b)) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fp16_kernel_is_row_invariant(dtype):
    """What makes a bfloat16 model's verify equal its one-token decodes (see the module docstring)."""
    for fan_in, fan_out in KERNEL_SHAPES:
        for bias in (False, True):
            w, b = weights(fan_in, fan_out, bias, seed=fan_in + fan_out)
            assert_row_invariant(Fp16Weights(w.bfloat16().float(), b), rows(7, fan_in, seed=fan_out).to(dtype),
                                 f"{fan_in}x{fan_out} bias={bias}")


def test_int8_kernel_scales_each_row_by_itself():
    """Activations are quantized per row: a zero row gives the bias alone, and a row scaled by a power
    of two (exact in float) gives its output scaled by it, bit for bit, at any magnitude."""
    w, b = weights(64, 48, True, seed=3)
    x = rows(4, 64, seed=4)
    x[1] = 0
    out = Int8Weights(w, b)(x)
    assert torch.isfinite(out).all() and torch.equal(out[1], b)
    kernel = Int8Weights(w, None)
    for power in (-60, -10, 10, 60):
        assert torch.equal(kernel(x * 2.0 ** power), kernel(x) * 2.0 ** power), power


@pytest.mark.slow
@pytest.mark.parametrize("name", ["int8", "fp16", "int4"])
def test_kernels_compile_to_one_graph_with_the_eager_bits(name):
    """Inside torch.compile the fbgemm weights are reached through the eyas custom ops (fullgraph: a
    graph break on an opaque packed object would raise)."""
    if name in ("int8", "fp16"):
        assert hasattr(torch.ops.eyas, f"fbgemm_{name}_linear")
    w, b = weights(96, 160, True, seed=5)
    kernel = KERNELS[name][0](w, b)
    compiled = torch.compile(lambda x: kernel(x), fullgraph=True, dynamic=True)
    # eager fp16 pads 1, 2 and 6k + 1, 6k + 2 rows (row invariance); compiled graphs attend batched
    # anyway and do not pad, so their bits match eager's at the other row counts
    for n in ((7, 3) if name != "fp16" else (5, 3)):
        x = rows(n, 96, seed=n)
        assert torch.equal(compiled(x), kernel(x)), n


def test_fused_linear_packs_quantized_and_releases_its_members():
    torch.manual_seed(0)
    members = [nn.Linear(64, 32), nn.Linear(64, 16)]
    x, residual = torch.randn(5, 64), torch.randn(5, 48)
    with torch.no_grad():
        expected = torch.cat([m(x) for m in members], dim=-1)
        originals = [(m.weight.clone(), m.bias.clone()) for m in members]
        fused = FusedLinear(members)
        fused.pack(Quantization("int8"))
        out = fused(x)
        assert relative_error(out, expected) < 0.05
        assert torch.equal(fused(x, residual.clone()), out + residual)
    assert fused.layout == Quantization("int8") and fused.kernel is not None
    for m, (w, b) in zip(members, originals):
        assert m.weight.is_meta and m.bias.is_meta
        assert m.weight.shape == w.shape and m.weight.dtype == w.dtype and m.bias.shape == b.shape
    # release=False (a tied lm_head): the members keep their real weights
    kept = [nn.Linear(64, 32, bias=False)]
    weight = kept[0].weight
    FusedLinear(kept).pack(Quantization("int4", 32), release=False)
    assert kept[0].weight is weight and not weight.is_meta


def test_a_bf16_weight_beyond_float16s_range_keeps_the_dense_kernel():
    linear = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight[3, 5] = 7e4  # > 65504
    fused = FusedLinear([linear])
    fused.pack("fp16")
    assert fused.layout == "linear" and fused.kernel is None and not linear.weight.is_meta
    in_range = FusedLinear([nn.Linear(64, 32, bias=False).to(torch.bfloat16)])
    in_range.pack("fp16")
    assert in_range.layout == "fp16" and in_range.kernel is not None


# --- the checks ---

def test_check_quantization_names_the_field_and_the_allowed_values():
    cpu = torch.device("cpu")
    assert SCHEMES == ("auto", "none", "int8", "int4", "gguf", "gguf_f32", "q8_0") and INT4_GROUP_SIZES == (32, 64, 128, 256)
    for scheme in SCHEMES:
        check_quantization(scheme, 128, cpu, "model")
    check_quantization("int8", 48, cpu, "model")  # the group size is int4's alone
    check_quantization("none", 48, torch.device("cuda"), "model")  # nothing to run: any device
    check_quantization("auto", 48, torch.device("cuda"), "model")  # resolved against the checkpoint first
    with pytest.raises(ConfigError, match=r"draft\.quantization must be one of \['auto', 'none', 'int8', 'int4', 'gguf', "
                                          r"'gguf_f32', 'q8_0'\], got 'int5'"):
        check_quantization("int5", 128, cpu, "draft")
    with pytest.raises(ConfigError, match=r"model\.quantization_group_size must be one of \[32, 64, 128, 256\]"):
        check_quantization("int4", 48, cpu, "model")
    for scheme in ("int8", "int4", "gguf", "gguf_f32"):
        with pytest.raises(ConfigError, match=rf"model\.quantization={scheme} runs on CPU only"):
            check_quantization(scheme, 128, torch.device("cuda"), "model")


def test_check_int4_shapes_names_the_projection_and_the_sizes_that_fit():
    check_int4_shapes({"qkv": (64, 128), "down": (128, 64)}, 64, "model")
    with pytest.raises(ConfigError, match=r"model\.quantization_group_size=64 does not divide the o projection's 96 "
                                          r"input features; group sizes that fit this model: \[32\]"):
        check_int4_shapes({"qkv": (64, 128), "o": (96, 64)}, 64, "model")
    with pytest.raises(ConfigError, match=r"draft\.quantization_group_size=32 does not divide .*: none"):
        check_int4_shapes({"fc": (48, 64)}, 32, "draft")
    with pytest.raises(ConfigError, match=r"draft\.quantization=int4 needs every projection's output width to be a "
                                          r"multiple of 16; the lm_head projection's is 200"):
        check_int4_shapes({"qkv": (64, 128), "lm_head": (64, 200)}, 32, "draft")


# --- load_model ---

def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    """All-position logits [B * T, V] of `ids` [B, T] (dense causal attention, no KV cache)."""
    with torch.inference_mode():
        hidden, _ = model(ids.flatten(), dense_positions(*ids.shape, "cpu"), dense_batch(*ids.shape))
        return model.compute_logits(hidden)


IDS = torch.randint(2, 320, (2, 9), generator=torch.Generator().manual_seed(0))


def fused_projections(model):
    for layer in model.model.layers:
        yield layer.self_attn.qkv
        yield layer.self_attn.out
        yield layer.mlp.gate_up
        yield layer.mlp.down


@pytest.mark.parametrize("scheme,group,bound", [("int8", 128, 0.2), ("int4", 32, 0.7), ("int4", 64, 0.7)])
@pytest.mark.parametrize("name", ["gqa", "tied_llama3", "qwen2", "linear_bias"])
def test_load_model_quantized(checkpoint, name, scheme, group, bound):
    path = checkpoint(name)
    dense = load_model(path, weight_layout="linear")
    model = load_model(path, quantization=scheme, quantization_group_size=group)
    fmt = Quantization(scheme, group)
    for fused in fused_projections(model):
        assert fused.layout == fmt and fused.kernel is not None
        for linear in fused.linears:
            assert linear.weight.is_meta
            assert linear.bias is None or linear.bias.is_meta
    assert model.logits_proj.layout == fmt and model.logits_proj.kernel is not None
    embed = model.model.embed_tokens.weight
    assert not embed.is_meta and torch.equal(embed, dense.model.embed_tokens.weight)
    if dense.config.tie_word_embeddings:  # the lm_head quantizes a copy; the embedding stays itself
        assert model.lm_head.weight is embed
    else:
        assert model.lm_head.weight.is_meta
    # released weights keep the checkpoint's shapes and dtypes; norms are real
    dense_params = dict(dense.named_parameters())
    for pname, p in model.named_parameters():
        assert p.shape == dense_params[pname].shape and p.dtype == dense_params[pname].dtype, pname
        if "norm" in pname:
            assert not p.is_meta and torch.equal(p, dense_params[pname]), pname
    got, expected = logits_of(model, IDS), logits_of(dense, IDS)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert relative_error(got, expected) < bound
    assert not torch.equal(got, expected)  # it did quantize


def test_load_model_int8_over_bfloat16(checkpoint):
    path = checkpoint("gqa")
    model = load_model(path, dtype="bfloat16", quantization="int8")
    assert model.model.layers[0].mlp.gate_up.layout == Quantization("int8")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    got = logits_of(model, IDS)
    assert torch.isfinite(got).all()
    assert relative_error(got, logits_of(load_model(path, weight_layout="linear"), IDS)) < 0.2


def test_load_model_refuses_what_its_kernels_cannot_run(checkpoint):
    with pytest.raises(ConfigError, match=r"model\.quantization=int8 runs on CPU only"):
        load_model(checkpoint("gqa"), device="cuda", quantization="int8")
    with pytest.raises(ConfigError, match=r"draft\.quantization=int4 runs on CPU only"):
        load_model(checkpoint("gqa"), device="cuda", quantization="int4", quantization_group_size=32, field="draft")
    with pytest.raises(ConfigError, match=r"model\.quantization_group_size=128 does not divide .*\[32, 64\]"):
        load_model(checkpoint("gqa"), quantization="int4")
    with pytest.raises(ConfigError, match=r"model\.quantization_group_size=64 does not divide .*\[32\]"):
        load_model(checkpoint("qwen3"), quantization="int4", quantization_group_size=64)  # head_dim 24: q is 96 wide


# --- config errors, as a user types them ---

@pytest.mark.parametrize("overrides,patterns", [
    (["model.quantization=int5"], [r"model\.quantization\b", "int5", r"none, int8, int4"]),
    (["model.quantization=int4", "model.quantization_group_size=48"],
     [r"model\.quantization_group_size must be one of \[32, 64, 128, 256\]", "48"]),
    (["model.quantization=int4"],  # the default group size, 128, on a 64-wide model
     [r"model\.quantization_group_size=128 does not divide", r"group sizes that fit this model: \[32, 64\]"]),
    (["model.quantization=int4", "model.quantization_group_size=256"],
     [r"model\.quantization_group_size=256 does not divide", r"\[32, 64\]"]),
    (["model.quantization_group_size=many"], [r"model\.quantization_group_size"]),
])
def test_target_quantization_errors_name_the_field(gqa_checkpoint, overrides, patterns):
    with pytest.raises(ConfigError) as info:
        build_engine([*PLAIN, f"model.path={gqa_checkpoint}", *overrides])
    for pattern in patterns:
        assert re.search(pattern, str(info.value)), (pattern, str(info.value))


@pytest.mark.parametrize("algorithm,overrides,patterns", [
    ("eagle3", ["draft.quantization=int5"], [r"draft\.quantization\b", "int5", r"none, int8, int4"]),
    ("eagle3", ["draft.quantization=int4", "draft.quantization_group_size=48"],
     [r"draft\.quantization_group_size must be one of \[32, 64, 128, 256\]"]),
    ("eagle3", ["draft.quantization=int4"],  # default 128: the head's qkv reads 2 * 64 features, its mlp 64
     [r"draft\.quantization_group_size=128 does not divide", r"\[32, 64\]"]),
    ("eagle3", ["draft.quantization=int4", "draft.quantization_group_size=32"],  # a draft vocabulary of 200
     [r"draft\.quantization=int4 needs every projection's output width to be a multiple of 16", "200",
      r"draft\.quantization=int8"]),
    ("eagle", ["draft.quantization=int4", "draft.quantization_group_size=48"], [r"draft\.quantization_group_size"]),
    ("standalone", ["draft.quantization=int4"], [r"draft\.quantization_group_size=128 does not divide", r"\[32, 64\]"]),
])
def test_draft_quantization_errors_name_the_field(spec_pair, algorithm, overrides, patterns):
    target, heads = spec_pair
    head = target if algorithm == "standalone" else heads[algorithm]
    with pytest.raises(ConfigError) as info:
        build_engine(engine_overrides(target, algorithm, *QUANT["int8"], *overrides, head=head))
    message = str(info.value)
    assert "model.quantization" not in message.replace("draft.", "")  # the draft's settings, not the target's
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)


# --- lossless over a quantized target ---

def run_spec(target, algorithm, scheme, prompts, params, *extra, head=None, **shape):
    """Generate with speculation over `target` quantized by `scheme`: (token ids, metrics, the target's
    and the draft model's first gate/up projections)."""
    with build_engine(engine_overrides(target, algorithm, *QUANT[scheme], *extra, head=head, **shape)) as eng:
        outs = eng.generate(prompts, params)
        metrics = eng.metrics()
        assert eng.scheduler.kv.all_free()
        target_model = eng.worker.target_runner.model
        draft = eng.worker.drafter.head.model if eng.worker.drafter.head is not None else None
    return [o.token_ids for o in outs], metrics, target_model, draft


def assert_accepted(metrics, floor: float) -> None:
    """Drafts were proposed and accepted: a drafter that never proposes cannot pass."""
    assert metrics["draft_accept_rate"] > 0
    assert metrics["mean_accept_length"] > floor


def test_the_plain_engine_runs_the_quantized_target(gqa_checkpoint):
    for scheme, fmt in QUANTIZATION.items():
        with build_engine([*PLAIN, f"model.path={gqa_checkpoint}", *QUANT[scheme]]) as eng:
            model = eng.worker.runner.model
            assert all(f.layout == fmt for f in fused_projections(model)) and model.logits_proj.layout == fmt
            out = eng.generate(PROMPTS[:2], GREEDY)
        assert all(len(o.token_ids) == 24 for o in out)


# (algorithm, head kind, shape, floor on the mean accept length)
DRAFTERS = [
    ("eagle3", "eagle3", dict(num_steps=1), 1.2),
    ("eagle3", "eagle3", dict(num_steps=3), 1.5),
    ("eagle3", "eagle3", dict(num_steps=5), 1.5),
    ("eagle3", "eagle3", dict(num_steps=3, topk=2), 1.5),  # an EAGLE-2 tree
    ("eagle3", "eagle3", dict(num_steps=4, topk=4, nodes=12), 1.5),
    ("eagle", "eagle", dict(num_steps=3), 1.5),
    ("eagle", "eagle", dict(num_steps=3, topk=2), 1.5),
    ("standalone", "target", dict(num_steps=3), 1.5),
    ("standalone", "target", dict(num_steps=3, topk=2, nodes=6), 1.5),
    ("hybrid", "eagle3", dict(num_steps=3), 1.5),
    ("hybrid", "eagle3", dict(num_steps=3, topk=2), 1.5),
]


def drafter_id(case) -> str:
    algorithm, _, shape, _ = case
    return f"{algorithm}-k{shape['num_steps']}-topk{shape.get('topk', 1)}"


@pytest.mark.parametrize("case", DRAFTERS, ids=[drafter_id(c) for c in DRAFTERS])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_greedy_speculation_over_a_quantized_target_equals_its_plain_decoding(spec_pair, plain_reference, scheme, case):
    algorithm, kind, shape, floor = case
    target, heads = spec_pair
    head = target if kind == "target" else heads[kind]
    got, metrics, target_model, _ = run_spec(target, algorithm, scheme, PROMPTS, GREEDY, head=head, **shape)
    assert target_model.model.layers[0].mlp.gate_up.layout == QUANTIZATION[scheme]
    assert got == plain_reference(target, PROMPTS, GREEDY, *QUANT[scheme])
    assert_accepted(metrics, floor)


@pytest.mark.parametrize("shape", [dict(num_steps=4), dict(num_steps=5, topk=4, nodes=12)], ids=["chain", "tree"])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_ngram_over_a_quantized_target_equals_its_plain_decoding(spec_pair, plain_reference, scheme, shape):
    target = spec_pair[0]
    got, metrics, _, draft = run_spec(target, "ngram", scheme, REPEATING_PROMPTS, PARAMS_16, **shape)
    assert draft is None
    assert got == plain_reference(target, REPEATING_PROMPTS, PARAMS_16, *QUANT[scheme])
    assert_accepted(metrics, 1.0)


@pytest.mark.parametrize("algorithm,kind,shape", [
    ("eagle3", "eagle3", dict(num_steps=3)), ("eagle3", "eagle3", dict(num_steps=3, topk=2)),
    ("standalone", "target", dict(num_steps=3)), ("hybrid", "eagle3", dict(num_steps=3)),
], ids=["eagle3-chain", "eagle3-tree", "standalone", "hybrid"])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_seeded_sampling_over_a_quantized_target_equals_its_plain_decoding(spec_pair, plain_reference, scheme,
                                                                           algorithm, kind, shape):
    target, heads = spec_pair
    head = target if kind == "target" else heads[kind]
    got, metrics, _, _ = run_spec(target, algorithm, scheme, PROMPTS_16, PARAMS_16, head=head, **shape)
    assert got == plain_reference(target, PROMPTS_16, PARAMS_16, *QUANT[scheme])
    assert_accepted(metrics, 1.3)


DRAFT_INT8 = ("draft.quantization=int8",)
DRAFT_INT4 = ("draft.quantization=int4", "draft.quantization_group_size=32")
DRAFT_Q8_0 = ("draft.quantization=q8_0",)


@pytest.mark.parametrize("scheme,kind,draft_quant,fmt,shape", [
    ("int8", "eagle3", DRAFT_INT8, Quantization("int8"), dict(num_steps=3)),
    ("int8", "eagle3", DRAFT_INT8, Quantization("int8"), dict(num_steps=3, topk=2)),
    ("int4", "eagle3", DRAFT_INT8, Quantization("int8"), dict(num_steps=3)),
    ("int8", "eagle", DRAFT_INT4, Quantization("int4", 32), dict(num_steps=3)),
    ("int4", "eagle", DRAFT_INT8, Quantization("int8"), dict(num_steps=4)),
    ("none", "eagle3", DRAFT_Q8_0, Quantization("gguf"), dict(num_steps=3)),
    ("none", "eagle3", DRAFT_Q8_0, Quantization("gguf"), dict(num_steps=3, topk=2)),
    ("q8_0", "eagle3", DRAFT_Q8_0, Quantization("gguf"), dict(num_steps=3)),
], ids=["int8-eagle3-int8", "int8-eagle3-int8-tree", "int4-eagle3-int8", "int8-eagle-int4", "int4-eagle-int8",
        "none-eagle3-q8_0", "none-eagle3-q8_0-tree", "q8_0-eagle3-q8_0"])
def test_a_quantized_head_stays_lossless(spec_pair, plain_reference, scheme, kind, draft_quant, fmt, shape):
    target, heads = spec_pair
    for params in (GREEDY, PARAMS_16):
        prompts = PROMPTS if params is GREEDY else PROMPTS_16
        got, metrics, _, draft = run_spec(target, kind, scheme, prompts, params, *draft_quant, head=heads[kind],
                                          **shape)
        assert got == plain_reference(target, prompts, params, *QUANT[scheme])
        assert_accepted(metrics, 1.3)
    layer = draft.midlayer if kind == "eagle3" else draft.layers[0]
    stored = lambda layout: layout.scheme == fmt.scheme and layout.group_size == fmt.group_size  # noqa: E731 (gguf: any fallback)
    assert stored(draft.fc_proj.layout) and stored(layer.mlp.gate_up.layout) and stored(layer.self_attn.qkv.layout)
    assert draft.fc.weight.is_meta and layer.mlp.gate_proj.weight.is_meta
    if kind == "eagle3":
        assert stored(draft.logits_proj.layout)
    else:  # an EAGLE-1 head reads the target's lm_head, quantized as the target's
        assert draft.logits_proj.layout == QUANTIZATION[scheme]


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("steps", [1, 4])
def test_the_target_quantized_alike_as_its_own_drafter_accepts_every_greedy_draft(spec_pair, plain_reference,
                                                                                 scheme, steps):
    """The standalone drafter is the target's checkpoint with draft.quantization = model.quantization:
    the same quantized model, so every greedy draft is right (a draft LM left in float would miss some)."""
    target = spec_pair[0]
    draft_quant = [o.replace("model.", "draft.") for o in QUANT[scheme]]
    got, metrics, _, draft = run_spec(target, "standalone", scheme, PROMPTS, GREEDY, *draft_quant, head=target,
                                      num_steps=steps)
    assert draft.kind == "lm" and draft.lm.model.layers[0].mlp.gate_up.layout == QUANTIZATION[scheme]
    assert got == plain_reference(target, PROMPTS, GREEDY, *QUANT[scheme])
    assert metrics["draft_accept_rate"] == 1.0 and metrics["mean_accept_length"] == steps + 1


def test_q8_0_rounds_each_group_of_32_to_its_scale_as_llama_cpp():
    """Codes in [-127, 127] times a float16 scale of the group's max / 127: each weight within half a step."""
    from eyas.engine.models.gguf_block_weights import round_to_q8_0

    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 96)
    w[5, 32:64] = 0  # an all-zero group: scale 0, codes 0
    blocks = round_to_q8_0(w)
    groups = w.view(48, 3, 32)
    assert torch.equal(blocks.scale, (groups.abs().amax(-1) / 127).half().float())
    assert blocks.codes.abs().max() <= 127 and blocks.codes[5, 32:64].eq(0).all() and blocks.scale[5, 1] == 0
    err = (blocks.dequantize() - w).abs().view(48, 3, 32)
    assert (err <= blocks.scale[..., None] * 0.5 + 1e-6 * groups.abs().amax(-1, keepdim=True)).all()
    gguf = pytest.importorskip("gguf")
    theirs = gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0),
                                    gguf.GGMLQuantizationType.Q8_0)
    assert (blocks.dequantize() != torch.from_numpy(theirs)).float().mean() < 0.01  # a code off by one, rarely


def test_a_head_auto_is_q8_0_on_a_cpu_and_none_elsewhere():
    from eyas.engine.models.weight_formats import resolve_head_quantization

    assert resolve_head_quantization("auto", torch.device("cpu")) == "q8_0"
    assert resolve_head_quantization("auto", torch.device("cuda")) == "none"
    assert resolve_head_quantization("int8", torch.device("cpu")) == "int8"


def test_the_default_models_head_runs_in_q8_0_blocks_and_the_tiny_pairs_in_float():
    from support import compose_config as compose

    assert compose(["model=smollm2"])["draft"]["quantization"] == "auto"
    assert compose(["model=tiny"])["draft"]["quantization"] == "none"
    assert compose(["model=smollm2", "draft.quantization=none"])["draft"]["quantization"] == "none"


def test_a_q8_0_target_runs_the_int8_dot_kernel_and_stays_close(gqa_checkpoint):
    model, dense = load_model(gqa_checkpoint, quantization="q8_0"), load_model(gqa_checkpoint)
    assert model.model.layers[0].mlp.gate_up.layout.scheme == "gguf" and model.logits_proj.layout.scheme == "gguf"
    got, expected = logits_of(model, IDS), logits_of(dense, IDS)
    assert relative_error(got, expected) < 0.1 and not torch.equal(got, expected)  # int8's bound here: 0.2


# --- the command line ---

def test_cli_runs_a_quantized_target_and_head(spec_pair, plain_reference, tmp_path):
    target, heads = spec_pair
    proc = run_cli("model.quantization=int8", "device=cpu", f"model.path={target}", "speculative=eagle3", "draft=eagle3",
                   f"draft.path={heads['eagle3']}", "draft.quantization=int8", "prompt=def add(a, b):",
                   "sampling.max_new_tokens=12", "sampling.ignore_eos=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "generated 12 tokens" in proc.stdout and "tau" in proc.stdout
    (saved,) = tmp_path.glob("outputs/*/*/outputs.json")
    token_ids = json.loads(saved.read_text())["outputs"][0]["token_ids"]
    assert [token_ids] == plain_reference(target, ["def add(a, b):"], SamplingParams(max_new_tokens=12, ignore_eos=True),
                                          *QUANT["int8"])


def test_cli_refuses_a_group_size_that_does_not_divide(gqa_checkpoint, tmp_path):
    proc = run_cli(*PLAIN, "model.quantization=int4", "device=cpu", f"model.path={gqa_checkpoint}", cwd=tmp_path)
    assert proc.returncode != 0
    assert "model.quantization_group_size=128" in proc.stderr + proc.stdout


# --- bfloat16 on CPU: the fp16 layout ---

@pytest.mark.parametrize("name", ["gqa", "tied_llama3", "qwen2"])
def test_a_bf16_model_on_cpu_gets_the_fp16_layout(checkpoint, name):
    path = checkpoint(name)
    model = load_model(path, dtype="bfloat16")
    dense = load_model(path, dtype="bfloat16", weight_layout="linear")
    assert model.model.layers[0].mlp.gate_up.layout == "fp16"
    assert all(f.layout == "fp16" for f in fused_projections(model)) and model.logits_proj.layout == "fp16"
    assert all(linear.weight.is_meta for f in fused_projections(model) for linear in f.linears)
    assert dense.model.layers[0].mlp.gate_up.layout == "linear" and dense.model.layers[0].mlp.gate_up.kernel is None
    embed = model.model.embed_tokens.weight
    assert not embed.is_meta and embed.dtype == torch.bfloat16
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is embed
    got, expected = logits_of(model, IDS), logits_of(dense, IDS)
    assert torch.isfinite(got).all()
    assert relative_error(got, expected) < 0.05


def test_a_bf16_engine_on_cpu_gets_the_fp16_layout_and_quantization_overrides_it(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "model.dtype=bfloat16"]) as eng:
        assert eng.worker.runner.model.model.layers[0].mlp.gate_up.layout == "fp16"
        assert len(eng.generate(PROMPTS[:1], GREEDY)[0].token_ids) == 24
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "model.dtype=bfloat16", *QUANT["int8"]]) as eng:
        assert eng.worker.runner.model.model.layers[0].mlp.gate_up.layout == Quantization("int8")


@pytest.mark.parametrize("target_name,algorithm,shape", [
    ("bigram", "eagle3", dict(num_steps=3)),
    ("bigram", "standalone", dict(num_steps=4)),
    ("gqa", "ngram", dict(num_steps=4)),
    ("gqa", "ngram", dict(num_steps=6, topk=2, nodes=9)),
], ids=["bigram-eagle3", "bigram-standalone", "gqa-ngram-chain", "gqa-ngram-tree"])
def test_bf16_speculation_on_cpu_equals_plain_decoding(checkpoint, spec_pair, plain_reference, target_name,
                                                       algorithm, shape):
    """A bfloat16 model on CPU, as configured by default (the fp16 layout): speculation emits plain
    decoding's tokens, so its verify must compute each position as a one-token decode does."""
    target = checkpoint(target_name)
    head = {"eagle3": spec_pair[1]["eagle3"], "standalone": target, "ngram": None}[algorithm]
    params = SamplingParams(max_new_tokens=64, ignore_eos=True)
    with build_engine(engine_overrides(target, algorithm, "model.dtype=bfloat16", head=head, **shape)) as eng:
        assert eng.worker.target_runner.model.model.layers[0].mlp.gate_up.layout == "fp16"
        got = [o.token_ids for o in eng.generate(PROMPTS_16, params)]
        assert eng.metrics()["draft_accept_rate"] > 0
    assert got == plain_reference(target, PROMPTS_16, params, "model.dtype=bfloat16")


# --- graphs ---

@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_compiled_graphs_over_a_quantized_target_and_head_are_lossless(spec_pair, plain_reference, scheme):
    target, heads = spec_pair
    compile_ = [] if GRAPHS else ["graphs.mode=compile"]  # EYAS_TEST_GRAPHS=compile sets it already
    got, metrics, _, _ = run_spec(target, "eagle3", scheme, PROMPTS, GREEDY, *compile_, "draft.quantization=int8",
                                  head=heads["eagle3"], num_steps=3)
    assert got == plain_reference(target, PROMPTS, GREEDY, *QUANT[scheme])
    assert_accepted(metrics, 1.5)
