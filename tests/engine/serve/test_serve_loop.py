"""The server's parts in process: the incremental detokenizer, the engine loop's failure handling and when a
stream's first bytes go out."""

import asyncio
from types import SimpleNamespace

import pytest
from support import build_engine
from support.engines import PLAIN

from eyas import SamplingParams
from eyas.engine.serve.detokenizer import IncrementalDetokenizer
from eyas.engine.serve.loop import EngineLoop, Finished, Stream, Tokens
from eyas.engine.serve.streaming import sse_response


@pytest.fixture(scope="module")
def shipped_tokenizer():
    with build_engine(PLAIN) as engine:
        return engine.tokenizer


@pytest.mark.parametrize("text,stop", [
    ("naïve café — 世界 😀 done", []),
    ("def f(x):\n    return x  # 😀\n", ["return"]),
    ("value = compute(a, b)\nprint(value)\n", ["(a, b)\nprint", "zzz"]),  # the stop spans tokens
])
def test_pieces_released_one_token_at_a_time_join_to_the_final_text(shipped_tokenizer, text, stop):
    """Tokens arrive one by one until a stop string shows (where the engine ends the request); the
    released pieces never carry a broken character and, with the rest, make the final text."""
    ids = shipped_tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(shipped_tokenizer, stop)
    pieces, fed = [], []
    for token in ids:
        fed.append(token)
        if any(s in shipped_tokenizer.decode(fed) for s in stop):
            break  # the engine ends the request: its last tokens come only as the final text
        pieces.append(detokenizer.add([token]))
    full = shipped_tokenizer.decode(fed)
    final = full[:min([full.find(s) for s in stop if s in full], default=len(full))]
    released = "".join(pieces)
    assert all("\ufffd" not in p for p in pieces)
    assert final.startswith(released)
    assert released + detokenizer.finish(final) == final
    assert len(pieces) > 3 and sum(1 for p in pieces if p) > 1  # released as it goes, not all at the end


def test_a_failing_engine_step_ends_its_requests_and_the_loop_goes_on(gqa_checkpoint, monkeypatch):
    engine = build_engine([*PLAIN, f"model.path={gqa_checkpoint}"])
    expected = engine.generate(prompt_token_ids=[[0, 5, 6, 7]], sampling=SamplingParams(max_new_tokens=6))[0].token_ids
    step, calls = engine.worker.step, []

    def flaky_step(requests):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return step(requests)

    monkeypatch.setattr(engine.worker, "step", flaky_step)
    loop = EngineLoop(engine, max_queue=8).start()

    async def one() -> Finished:
        stream = Stream([0, 5, 6, 7], SamplingParams(max_new_tokens=6))
        loop.submit(stream)
        while not isinstance(event := (await stream.events.get())[1], Finished):
            pass
        return event

    try:
        failed = asyncio.run(one())
        assert failed.output.finish_reason == "error" and "device lost" in failed.output.error
        served = asyncio.run(one())
        assert served.output.finish_reason == "length" and served.output.token_ids == expected
        assert loop.alive and loop.stats.step_errors == 1
    finally:
        loop.stop()
    assert engine.scheduler.kv.all_free()


def test_a_streams_opening_chunks_go_out_with_its_first_token_not_before(shipped_tokenizer):
    """A chat stream's role chunk waits for the first token (as vLLM sends it): a replicated server's ingress
    reads a stream's first bytes as its prompt computed."""
    async def main():
        stream = Stream([1], SamplingParams(max_new_tokens=4))
        response = sse_response(SimpleNamespace(abort=lambda s: None), shipped_tokenizer, [stream],
                                lambda index, text, reason, entries, offset: {"text": text}, None,
                                first=[{"role": "assistant"}])
        body = response.body_iterator
        opening = asyncio.ensure_future(body.__anext__())
        await asyncio.sleep(0.1)
        assert not opening.done()  # nothing goes out while the prompt is computed
        stream.events.put_nowait((0, Tokens(shipped_tokenizer.encode(" hello"))))
        assert await asyncio.wait_for(opening, 5) == 'data: {"role": "assistant"}\n\n'
        assert await asyncio.wait_for(body.__anext__(), 5) == 'data: {"text": " hello"}\n\n'
        await body.aclose()

    asyncio.run(main())
