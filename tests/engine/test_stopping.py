"""Each request ends on its own stop: eos, stop string, max_new_tokens."""

from support import build_engine
from support.engines import PLAIN, PROMPTS

from eyas import SamplingParams


def test_stop_conditions(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        free = eng.generate(PROMPTS[:4], SamplingParams(max_new_tokens=30, ignore_eos=True))
        eos = eng.stop_checker.eos_token_ids
        assert eos == {1}  # from config.json

        # eos: pick a token the free run emits and declare it eos for this engine
        victim = free[0].token_ids[5]
        eng.stop_checker.eos_token_ids = frozenset({victim})
        by_eos = eng.generate(PROMPTS[:4], SamplingParams(max_new_tokens=30))
        first = free[0].token_ids.index(victim)
        assert by_eos[0].token_ids == free[0].token_ids[:first + 1]
        assert by_eos[0].finish_reason == "stop"
        ignored = eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=30, ignore_eos=True))
        assert ignored[0].token_ids == free[0].token_ids
        eng.stop_checker.eos_token_ids = frozenset(eos)

        # stop string: a piece of the free run's text
        text = free[2].text
        stop = text[10:13]
        by_stop = eng.generate(PROMPTS[:4], [SamplingParams(max_new_tokens=30, ignore_eos=True, stop=[stop])
                                         if i == 2 else SamplingParams(max_new_tokens=7, ignore_eos=True)
                                         for i in range(4)])
        cut = text.find(stop)
        assert by_stop[2].text == text[:cut] and by_stop[2].finish_reason == "stop"
        assert free[2].token_ids[:len(by_stop[2].token_ids)] == by_stop[2].token_ids
        assert eng.tokenizer.decode(by_stop[2].token_ids).find(stop) >= 0
        assert eng.tokenizer.decode(by_stop[2].token_ids[:-1]).find(stop) < 0  # ended at the first match

        # max_new_tokens, per request
        assert [len(o.token_ids) for i, o in enumerate(by_stop) if i != 2] == [7, 7, 7]
        assert all(o.finish_reason == "length" for i, o in enumerate(by_stop) if i != 2)
        assert [o.token_ids for i, o in enumerate(by_stop) if i != 2] == [free[i].token_ids[:7] for i in (0, 1, 3)]


def test_late_stop_strings_end_at_the_earliest_match(gqa_checkpoint):
    """A stop string far into the output (only a tail of the output is decoded per token), and
    several stop strings: the text is cut before whichever shows first."""
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        free = eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=60, ignore_eos=True))[0]
        text = free.text
        late = text[len(text) * 3 // 4:][:2]
        first = text.find(late)
        assert len(eng.tokenizer.encode(text[:first])) > 2 * len(late) + 8, "the match must lie past the decoded tail"
        never = "\x00never"
        out = eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=60, ignore_eos=True, stop=[never, late]))[0]
        assert out.text == text[:first] and out.finish_reason == "stop"
        assert free.token_ids[:len(out.token_ids)] == out.token_ids
        assert eng.tokenizer.decode(out.token_ids[:-1]).find(late) < 0  # ended at the first token that shows it


def test_stop_string_at_the_very_start_of_the_output(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        free = eng.generate(PROMPTS[:4], SamplingParams(max_new_tokens=12, ignore_eos=True))
        for out, prompt in zip(free, PROMPTS[:4]):
            stop = out.text[:2]
            if not stop:
                continue
            got = eng.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True, stop=[stop]))[0]
            assert got.text == "" and got.finish_reason == "stop"
            assert got.token_ids == out.token_ids[:len(got.token_ids)]


def test_stop_strings_decode_only_a_tail_per_token(gqa_checkpoint, monkeypatch):
    """Checking stop strings that never match costs a bounded decode per token, not the whole output."""
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        decoded = []
        decode = eng.tokenizer.decode

        def recording_decode(ids, *args, **kwargs):
            decoded.append(len(ids))
            return decode(ids, *args, **kwargs)

        monkeypatch.setattr(eng.tokenizer, "decode", recording_decode)
        stops = ["\x00never", "\x01nor"]
        out = eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=80, ignore_eos=True, stop=stops))[0]
        assert out.finish_reason == "length" and len(out.token_ids) == 80
        window = 2 * max(map(len, stops)) + 8
        per_token = decoded[:-1]  # the last decode is the output text
        assert len(per_token) == 80 and max(per_token) <= window


def test_time_to_first_token_is_measured(gqa_checkpoint):
    with build_engine([*PLAIN, f"model.path={gqa_checkpoint}"]) as eng:
        out = eng.generate(PROMPTS[:2], SamplingParams(max_new_tokens=5, ignore_eos=True))[0]
    assert 0 < out.stats["time_to_first_token_s"] <= out.stats["latency_s"]
