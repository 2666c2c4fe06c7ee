"""`model.quantization=gguf` / `gguf_f32`: a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks kept as the file stores
them. gguf_f32's kernel (`kernels/cpu_quant_gemm.cpp`) computes the same bits as the blocked float32 GEMM
over the dequantized weights, so a model loaded so computes the dequantized model's logits bit for bit;
gguf's (`kernels/cpu_int8_dot_gemm.cpp`, int8 activations) computes what its float64 reference does up to
float32 rounding. Both compute a row alike alone or in any batch, speculation over either stays lossless,
and misuse is a ConfigError naming the field."""

import subprocess
import sys

import pytest
import torch
from support import build_engine
from support.checkpoints import fixture_dir
from support.engines import PLAIN, engine_overrides, random_requests_match_plain
from support.forwards import dense_logits
from support.gguf_fixtures import BOS, write_gguf

from eyas import SamplingParams
from eyas.engine.cpu_ops import cpu_ops_error
from eyas.engine.errors import ConfigError
from eyas.engine.models.checkpoint_source import checkpoint_directory
from eyas.engine.models.gguf_block_weights import GgufBlockWeights
from eyas.engine.models.gguf_file import Blocks
from eyas.engine.models.loader import load_model
from eyas.engine.tokenizer import Tokenizer
from eyas.kernels import cpu_gemm, cpu_int8_dot_gemm, cpu_quant_gemm
from eyas.testing.checkpoints import write_eagle3_head

pytest.importorskip("gguf")
if cpu_ops_error() is not None:
    pytest.skip(f"eyas's CPU kernels cannot be built here: {cpu_ops_error()}", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("cache_root", "one_thread")  # metadata directories in the tests' cache root

ENGINE = ["num_threads=1", "cache=small"]


def random_blocks(kind: str, rows: int, fan_in: int, generator: torch.Generator) -> Blocks:
    """Blocks as a file holds them: float16 scales (and Q4_1 offsets), codes of the type's width."""
    if kind == "Q8_0":
        codes = torch.randint(-128, 128, (rows, fan_in), generator=generator, dtype=torch.int32)
    else:
        codes = torch.randint(0, 16, (rows, fan_in), generator=generator, dtype=torch.int32)
    scale = (torch.rand(rows, fan_in // 32, generator=generator) * 0.02).half().float()
    if kind == "Q4_1":
        offset = (torch.randn(rows, fan_in // 32, generator=generator) * 0.1).half().float()
    else:
        offset = -8 * scale if kind == "Q4_0" else torch.zeros_like(scale)
    return Blocks(kind, codes, scale, offset)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows,fan_in", [(16, 32), (200, 64), (33, 96), (100, 160)])
def test_kernel_equals_the_blocked_gemm_over_the_dequantized_weight(kind, rows, fan_in):
    """Bit for bit, at every row count a tile or span may split (tails of 1 .. 6 rows, 1 .. 4 blocks),
    with bias and residual; each row equals the row computed alone."""
    generator = torch.Generator().manual_seed(rows + fan_in)
    blocks = random_blocks(kind, rows, fan_in, generator)
    bias = torch.randn(rows, generator=generator)
    ours = GgufBlockWeights([blocks], bias, int8_activations=False)
    packed = cpu_gemm.pack(blocks.dequantize())
    x = torch.randn(13, fan_in, generator=generator)
    residual = torch.randn(13, rows, generator=generator)
    alone = torch.cat([ours(x[i:i + 1], residual[i:i + 1]) for i in range(13)])
    for m in range(1, 14):
        out = ours(x[:m], residual[:m])
        assert torch.equal(out, cpu_gemm.blocked_linear(x[:m], packed, rows, bias, residual[:m]))
        assert torch.equal(out, alone[:m])


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows,fan_in", [(16, 32), (200, 64), (33, 96), (100, 160)])
def test_int8_kernel_matches_its_reference_and_computes_rows_alone(kind, rows, fan_in):
    """Against the float64 reference of the same arithmetic (x quantized to int8 per group of 32, exact
    integer dot products), within float32 rounding; bit for bit a row alone at every row count a tile or
    span may split (tails of 1 .. 4 rows, 1 .. 4 blocks), with bias and residual."""
    generator = torch.Generator().manual_seed(rows * fan_in)
    blocks = random_blocks(kind, rows, fan_in, generator)
    bias = torch.randn(rows, generator=generator)
    ours = GgufBlockWeights([blocks], bias, int8_activations=True)
    x = torch.randn(13, fan_in, generator=generator)
    x[3, :32] = 0  # a group of zeros: scale 0, no division by it
    residual = torch.randn(13, rows, generator=generator)
    alone = torch.cat([ours(x[i:i + 1], residual[i:i + 1]) for i in range(13)])
    for m in range(1, 14):
        assert torch.equal(ours(x[:m], residual[:m]), alone[:m])
    expected = cpu_int8_dot_gemm.reference(x, blocks.codes, blocks.scale, blocks.offset) + bias + residual
    torch.testing.assert_close(alone, expected, rtol=1e-5, atol=1e-5)
    # and it is the dequantized weights' product up to the activations' 8 bits
    dense = x @ blocks.dequantize().t() + bias + residual
    assert (alone - dense).abs().max() < 0.02 * dense.abs().max()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("sign", [1, -1])
def test_int8_kernel_is_exact_at_the_largest_codes_and_activations(kind, sign):
    """The largest products a group can sum (every code at its type's extreme, every activation at +-127
    after quantization): the AVX2 loop sums a 4-bit group's byte pairs in int16 (at most 8 x 3810 = 30480)
    and must not wrap; the result is the exact integer dot product's, at 1 to 6 rows."""
    rows, fan_in = 48, 128
    codes = torch.full((rows, fan_in), -128 if kind == "Q8_0" else 15, dtype=torch.int32)
    scale = torch.full((rows, fan_in // 32), 2.0 ** -10)
    offset = torch.zeros_like(scale) if kind != "Q4_0" else -8 * scale
    blocks = Blocks(kind, codes, scale, offset)
    ours = GgufBlockWeights([blocks], None, int8_activations=True)
    x = torch.full((6, fan_in), float(sign))  # quantizes to 127 (or -127) everywhere, scale 1 / 127
    expected = cpu_int8_dot_gemm.reference(x, codes, scale, offset)
    for m in range(1, 7):
        torch.testing.assert_close(ours(x[:m]), expected[:m], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("int8_activations", [False, True])
def test_fused_members_stack_along_the_outputs(int8_activations):
    """q / k / v (Q4_0 and Q4_1 mixed) as one weight: each member's columns as its own projection."""
    generator = torch.Generator().manual_seed(3)
    members = [random_blocks(kind, rows, 64, generator) for kind, rows in (("Q4_1", 64), ("Q4_0", 32), ("Q4_1", 32))]
    x = torch.randn(5, 64, generator=generator)
    fused = GgufBlockWeights(members, None, int8_activations)(x)
    separate = torch.cat([GgufBlockWeights([m], None, int8_activations)(x) for m in members], dim=1)
    assert torch.equal(fused, separate)


def test_packed_codes_use_half_a_byte_a_weight():
    codes = torch.randint(0, 16, (48, 64), dtype=torch.int32)
    assert tuple(cpu_quant_gemm.pack_codes(codes, 4).shape) == (3, 64, 8)
    assert tuple(cpu_int8_dot_gemm.pack_codes(codes, 4).shape) == (3, 2, 256)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_model_computes_the_dequantized_models_logits_exactly(gguf_model, arch, qtype):
    """gguf_f32: every projection (the tied head too) runs on the file's blocks, and the logits equal those
    of the dequantized float32 model in the blocked layout, bit for bit; gguf (int8 activations) ranks
    the same tokens first on these sequences."""
    path = gguf_model(arch, qtype)
    ours = load_model(path, dtype="float32", quantization="gguf_f32")
    int8 = load_model(path, dtype="float32", quantization="gguf")
    dense = load_model(path, dtype="float32", quantization="none", weight_layout="blocked")
    fused = [ours.logits_proj] + [f for layer in ours.model.layers
                                  for f in (layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up, layer.mlp.down)]
    assert all(isinstance(f.kernel, GgufBlockWeights) for f in fused)
    assert not any(hasattr(m, "gguf_blocks") for m in ours.modules())  # released once packed
    vocab = ours.config.vocab_size
    with torch.no_grad():
        for ids in ([BOS, 5, 17, vocab - 1, 42], list(range(3, vocab, 9))):
            exact = dense_logits(ours, ids)
            assert torch.equal(exact, dense_logits(dense, ids))
            approximate = dense_logits(int8, ids)
            assert (approximate.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.75
            assert (approximate - exact).abs().mean() < 0.05 * exact.abs().mean()


def test_tensors_the_file_holds_in_float_take_the_float_layout(gguf_model):
    """An F16 file has no blocks: its projections are dequantized and packed in the layout asked for."""
    model = load_model(gguf_model("llama", "F16"), dtype="float32", quantization="gguf", weight_layout="linear")
    assert model.model.layers[0].mlp.down.layout == "linear" and model.model.layers[0].mlp.down.kernel is None


@pytest.fixture(scope="module")
def q4_target(tmp_path_factory):
    return fixture_dir(tmp_path_factory, "gguf-blocks-llama-q41",
                       lambda d: write_gguf(d / "model.gguf", "llama", "Q4_1")) / "model.gguf"


@pytest.mark.parametrize("algorithm,scheme", [("eagle3", "gguf"), ("ngram", "gguf"), ("eagle3", "gguf_f32")])
def test_speculation_over_the_files_blocks_equals_plain_decoding(q4_target, algorithm, scheme, tmp_path_factory,
                                                                  gguf_cache):
    """Verify runs k + 1 rows through the block kernel, decode one: greedy and seeded requests equal plain
    decoding of the same blocks."""
    head = None
    if algorithm == "eagle3":
        meta = checkpoint_directory(q4_target)
        head = fixture_dir(tmp_path_factory, "gguf-blocks-head",
                           lambda d: write_eagle3_head(d / "head", meta, aux_layer_ids=[0, 1, 1])) / "head"
    engine = [f"model.quantization={scheme}", *ENGINE]
    overrides = engine_overrides(q4_target, algorithm, *engine, head=head, num_steps=3)
    vocab = Tokenizer.from_dir(checkpoint_directory(q4_target)).vocab_size
    random_requests_match_plain(q4_target, overrides, count=6, seed=5, vocab=vocab, plain=tuple(engine))


def recorded_logits(eng, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], list[torch.Tensor]]:
    """(tokens per prompt, the logits of every forward in order) of one generate."""
    model, seen = eng.worker.runner.model, []
    compute = model.compute_logits

    def recording(hidden):
        logits = compute(hidden)
        seen.append(logits.clone())
        return logits

    model.compute_logits = recording
    try:
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
    finally:
        del model.compute_logits
    return [o.token_ids for o in outs], seen


@pytest.mark.slow  # compiles the target's two decode packages: about 30 s
@pytest.mark.parametrize("scheme", ["gguf", "gguf_f32"])
def test_the_files_blocks_run_inside_aot_graphs_as_eager(q4_target, scheme, tmp_path):
    """The block kernels are custom ops the exporter traces through: the packages call them, and decode
    emits eager's tokens. With `gguf`'s 7-bit activations the target attends batch-invariant, eager and
    graphs alike (eyas's paged op, a query at a time; the ragged prefill of a batch eager, one prompt a
    call): every forward's logits have eager's bits, so a swap mid-run cannot change a token."""
    overrides = [*PLAIN, f"model.path={q4_target}", f"model.quantization={scheme}"]
    prompts = [[BOS, 5, 9, 12], [BOS, 7, 3, 3, 8, 20], [BOS, 11, 2]]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    with build_engine(overrides) as eng:
        eager, eager_logits = recorded_logits(eng, prompts, params)
    with build_engine([*overrides, "graphs.mode=aot", f"graphs.cache_dir={tmp_path}"]) as eng:
        graphed, graphed_logits = recorded_logits(eng, prompts, params)
        assert eng.worker.graph.forward(False)._fallback is None and eng.worker.graph.num_runs > 0
        assert eng.worker.runner.attn_backend.batch_invariant == (scheme == "gguf")
    assert graphed == eager
    if scheme == "gguf":
        assert len(graphed_logits) == len(eager_logits)
        assert all(torch.equal(g, e) for g, e in zip(graphed_logits, eager_logits))


def test_gguf_quantization_of_a_directory_names_the_fields():
    """The shipped (safetensors) target cannot keep GGUF blocks: model.quantization and model.path named."""
    with pytest.raises(ConfigError, match=r"model\.quantization=gguf.*model\.path.*none, int8, int4"):
        build_engine([*PLAIN, "model=tiny", "model.quantization=gguf", "prompt=null"])


def test_gguf_quantization_of_an_eagle_head_is_refused(q4_target):
    with pytest.raises(ConfigError, match=r"draft\.quantization=gguf.*none, int8, int4"):
        build_engine([f"model.path={q4_target}", "model.quantization=gguf", *ENGINE, "speculative=eagle3", "adaptive=off",
                      "draft.quantization=gguf", "prompt=null"])


def test_cli_names_the_allowed_schemes():
    done = subprocess.run([sys.executable, "-m", "eyas", "model=tiny", "model.quantization=q4"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "model.quantization" in done.stderr and "gguf" in done.stderr


def test_auto_keeps_a_gguf_files_blocks_on_a_cpu_and_dequantizes_elsewhere(q4_target, gqa_checkpoint):
    """`model.quantization=auto` (the default model's): gguf for a GGUF file on a CPU, none for a Hugging Face
    directory or a GPU; the engine built over the default model group runs a GGUF path on its blocks and a
    directory in floats."""
    from eyas.containers.factories import model_quantization

    meta = checkpoint_directory(q4_target)
    assert model_quantization("auto", meta, torch.device("cpu")) == "gguf"
    assert model_quantization("auto", meta, torch.device("cuda")) == "none"
    assert model_quantization("auto", gqa_checkpoint, torch.device("cpu")) == "none"
    assert model_quantization("gguf_f32", meta, torch.device("cpu")) == "gguf_f32"
    for path, blocks in ((q4_target, True), (gqa_checkpoint, False)):
        with build_engine(["model=smollm2", f"model.path={path}", *PLAIN, *ENGINE, "prompt=null"]) as eng:
            down = eng.worker.runner.model.model.layers[0].mlp.down
            assert isinstance(down.kernel, GgufBlockWeights) == blocks, path
