"""The engine at its limits: a run that reaches the context length, an error in the middle of
`generate`, a device that is not there, seeds at the ends of their range."""

import pytest
import torch
from support import build_engine
from support.engines import PLAIN, PROMPTS, engine_overrides

from eyas import ConfigError, SamplingParams


@pytest.mark.parametrize("kind,num_steps", [("eagle", 5), ("eagle3", 4)])
def test_speculation_runs_up_to_max_context_len(spec_pair, plain_reference, kind, num_steps):
    """Requests whose max_new_tokens reach past the context end at it, as in plain decoding, though a
    verify forward writes num_steps positions past the committed length."""
    target, heads = spec_pair
    params = SamplingParams(max_new_tokens=200, ignore_eos=True)
    context = ["cache.max_context_len=40", "cache.page_size=16"]
    with build_engine(engine_overrides(target, kind, *context, head=heads[kind], num_steps=num_steps)) as eng:
        spec = eng.generate(PROMPTS[:4], params)
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in spec] == plain_reference(target, PROMPTS[:4], params, *context)
    for out in spec:
        assert out.finish_reason == "length"
        assert len(out.prompt_token_ids) + len(out.token_ids) == 40


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("speculative", [False, True])
def test_error_inside_generate_leaves_nothing_running(spec_pair, plain_reference, monkeypatch, speculative):
    target, heads = spec_pair
    overrides = engine_overrides(target, "eagle", head=heads["eagle"]) if speculative else engine_overrides(target)
    params = [SamplingParams(max_new_tokens=20, ignore_eos=True), SamplingParams(max_new_tokens=20, temperature=0.9,
                                                                                 seed=4, ignore_eos=True)] * 2
    expected = plain_reference(target, PROMPTS[:4], params)
    with build_engine([*overrides, "cache.max_running_requests=2"]) as eng:  # two run, two wait
        runner = eng.worker.target_runner if speculative else eng.worker.runner
        forward, calls = runner.forward, []

        def failing_forward(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise Boom("device lost")
            return forward(*args, **kwargs)

        monkeypatch.setattr(runner, "forward", failing_forward)
        with pytest.raises(Boom):
            eng.generate(PROMPTS[:4], params)
        assert not eng.scheduler.has_work()
        assert eng.scheduler.kv.all_free()
        monkeypatch.setattr(runner, "forward", forward)
        again = eng.generate(PROMPTS[:4], params)  # the engine still works, and gives what a fresh one gives
    assert [o.token_ids for o in again] == expected


def test_device_cuda_without_cuda_is_a_clear_error(gqa_checkpoint, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device=cuda but no CUDA device is available; allowed here: auto, cpu"):
        build_engine([*PLAIN, f"model.path={gqa_checkpoint}", "device=cuda"])


def test_seeds_span_64_bits(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        outs = eng.generate(["import os"] * 3, [SamplingParams(max_new_tokens=12, temperature=1.0, seed=s, ignore_eos=True)
                                                for s in (0, 2**63, 2**64 - 1)])
    assert len({tuple(o.token_ids) for o in outs}) == 3
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
            SamplingParams(seed=bad)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_one_token_prompts_under_speculation(spec_pair, plain_reference, kind):
    target, heads = spec_pair
    prompts = [[0], [5], [0, 7, 9]]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    plain = plain_reference(target, prompts, params)
    with build_engine(engine_overrides(target, kind, head=heads[kind])) as eng:
        spec = [o.token_ids for o in eng.generate(prompt_token_ids=prompts, sampling=params)]
    assert spec == plain and all(len(t) == 12 for t in spec)
