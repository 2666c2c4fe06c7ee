"""Ahead-of-time compiled graphs (graphs.mode=aot): AOTInductor packages give the eager engine's tokens,
hold no weights (a checkpoint of the same shapes reuses them and still decodes as itself), are loaded
by a second engine without compiling, and what cannot be exported runs as a torch.compile graph.

Every lossless test runs with them too: `EYAS_TEST_GRAPHS=aot python -m pytest tests/e2e/test_spec_lossless.py`.
"""

import logging

import pytest
import torch
from support import build_engine
from support.checkpoints import CHECKPOINTS
from support.engines import PROMPTS, engine_overrides
from support.packages import aot, packages

from eyas import SamplingParams
from eyas.engine.graphs.exported import ExportedForward
from eyas.testing.checkpoints import write_llama

GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)
MIXED = [GREEDY if i % 2 == 0 else SAMPLED for i in range(len(PROMPTS))]


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["one", "ragged-batch"])
def test_aot_plain_decoding_equals_eager(gqa_checkpoint, plain_reference, aot_cache, prompts):
    params = [GREEDY if i % 2 == 0 else SAMPLED for i in range(len(prompts))]
    with build_engine(engine_overrides(gqa_checkpoint, "none", *aot(aot_cache))) as eng:
        outs = eng.generate(prompts, params)
        forward = eng.worker.graph.forward(False)
        assert isinstance(forward, ExportedForward) and forward._fallback is None  # packages, not torch.compile
        assert eng.worker.graph.num_runs > 0 and eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == plain_reference(gqa_checkpoint, prompts, params)


def test_a_package_reads_a_strided_view_as_its_values(gqa_checkpoint, aot_cache):
    # a package reads its inputs row-major: inputs cut from wider tensors (a draft model's features, a
    # column of a table) must reach it as their values (a view read as it lies in memory made NaNs)
    with build_engine(engine_overrides(gqa_checkpoint, "none", *aot(aot_cache))) as eng, torch.inference_mode():
        forward = eng.worker.graph.forward(False)
        wide = torch.tensor([[5, 6], [7, 8], [9, 10]])
        tokens, positions, slots = wide[:, :1], wide[:, 1:] - 5, torch.full((3, 8), -1)  # slot -1: the scratch row
        assert not tokens.is_contiguous()
        viewed, _ = forward(tokens, positions, torch.full((3, 1), -1), slots)
        copied, _ = forward(tokens.contiguous(), positions.contiguous(), torch.full((3, 1), -1), slots)
        assert forward.shapes_seen == {(True, True), (False, True)} and forward._fallback is None
    assert torch.equal(viewed, copied)


@pytest.mark.slow  # the target's and the head's packages of a speculative config: about 90 s cold
@pytest.mark.parametrize("shape", [dict(num_steps=3), dict(num_steps=3, topk=2)], ids=["chain", "tree"])
def test_aot_verify_and_draft_steps_are_lossless(spec_pair, plain_reference, aot_cache, shape):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "eagle3", *aot(aot_cache), head=heads["eagle3"], **shape)) as eng:
        outs = eng.generate(PROMPTS, GREEDY)
        state = eng.worker.state
        assert state.verify_graph.num_runs > 0 and state.draft_graph.num_runs > 0
        assert state.verify_graph.forward("topk" in shape)._fallback is None
        assert state.draft_graph.forward(False)._fallback is None
    assert [o.token_ids for o in outs] == plain_reference(target, PROMPTS, GREEDY)


def test_a_package_holds_no_weights_and_a_second_engine_loads_it_without_compiling(
        gqa_checkpoint, plain_reference, aot_cache, tmp_path):
    with build_engine(engine_overrides(gqa_checkpoint, "none", *aot(aot_cache))) as eng:
        eng.generate(PROMPTS[:2], GREEDY)
        assert eng.worker.graph.forward(False).shapes_seen == {(True, True), (False, True)}  # warmup: both
    written = packages(aot_cache)
    assert written
    # the same shapes with other weights: the same packages, and this checkpoint's own tokens
    twin = write_llama(tmp_path / "twin", **{**CHECKPOINTS["gqa"], "seed": 11})
    with build_engine(engine_overrides(twin, "none", *aot(aot_cache))) as eng:
        outs = eng.generate(PROMPTS, GREEDY)
        forward = eng.worker.graph.forward(False)
        assert forward.shapes_seen == {(True, True), (False, True)} and eng.worker.graph.num_runs > 0
    assert packages(aot_cache) == written  # nothing compiled again
    assert [o.token_ids for o in outs] == plain_reference(twin, PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] != plain_reference(gqa_checkpoint, PROMPTS, GREEDY)


def test_a_package_serves_a_pool_of_another_size(gqa_checkpoint, plain_reference, aot_cache):
    """The KV pool's size is symbolic in a package: an engine with another cache config (a server's, a
    benchmark's) loads the packages another compiled and decodes as eager does, writing into its own pool."""
    with build_engine(engine_overrides(gqa_checkpoint, "none", *aot(aot_cache))) as eng:
        eng.generate(PROMPTS[:2], GREEDY)
    written = packages(aot_cache)
    for pool in ("cache.max_total_tokens=1024", "cache.max_total_tokens=20480"):
        with build_engine(engine_overrides(gqa_checkpoint, "none", *aot(aot_cache), pool)) as eng:
            outs = eng.generate(PROMPTS, MIXED)
            assert eng.worker.graph.num_runs > 0 and eng.worker.graph.forward(False)._fallback is None
            assert eng.worker.runner.kv_pool.num_slots != 2048 and eng.scheduler.kv.all_free()
        assert packages(aot_cache) == written  # loaded, not compiled again
        assert [o.token_ids for o in outs] == plain_reference(gqa_checkpoint, PROMPTS, MIXED)


@pytest.mark.slow  # an int8 target compiles through torch.compile: about a minute
def test_a_forward_it_cannot_export_runs_as_a_compiled_graph(gqa_checkpoint, plain_reference, tmp_path, caplog):
    quantized = "model.quantization=int8"
    with caplog.at_level(logging.WARNING, logger="eyas.graphs"):
        with build_engine(engine_overrides(gqa_checkpoint, "none", *aot(tmp_path), quantized)) as eng:
            outs = eng.generate(PROMPTS, GREEDY)
            assert eng.worker.graph.forward(False)._fallback is not None and eng.worker.graph.num_runs > 0
    assert "is not exportable (a compressed weight format runs its own kernel)" in caplog.text
    assert not packages(tmp_path)
    assert [o.token_ids for o in outs] == plain_reference(gqa_checkpoint, PROMPTS, GREEDY, quantized)
