"""The OpenAI sampling surface through the official client: logprobs, penalties, logit_bias, n and stop
token ids, on a plain server and on the default (speculative) one, which must agree on greedy text and
logprobs (bit for bit)."""

import json
import re

import openai
import pytest
from openai import OpenAI
from support import build_engine
from support.server_process import MODEL, SERVED_PROMPTS, ServerProcess

from eyas import SamplingParams

PENALTIES = dict(presence_penalty=0.5, frequency_penalty=0.4)
EXTRA = {"repetition_penalty": 1.2}  # vLLM's field, outside the client's signature


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """(plain, speculative): clients of a plain-decoding server and of a default one, as users start them:
    the second packs its weights as the first timed them (the layouts recorded in the cache root that
    the test run shares), so both run the same kernels."""
    plain = ServerProcess("speculative=none", "draft=none", cwd=tmp_path_factory.mktemp("plain"))
    default = ServerProcess(cwd=tmp_path_factory.mktemp("default"))
    yield [OpenAI(base_url=p.base + "/v1", api_key="unused", max_retries=0) for p in (plain, default)]
    plain.stop()
    default.stop()


def same_completion_logprobs(a, b) -> None:
    # equal, not close: a forward that carries a logprobs request computes each position as a decode would
    assert a.tokens == b.tokens and a.text_offset == b.text_offset
    assert a.token_logprobs == b.token_logprobs and a.top_logprobs == b.top_logprobs


def test_greedy_logprobs_penalties_bias_and_n_agree_with_and_without_speculation(clients):
    bias = {"13": -100, "88": 2.5}
    replies = [c.completions.create(model=MODEL, prompt=SERVED_PROMPTS[0], max_tokens=40, temperature=0, logprobs=3,
                                    n=2, logit_bias=bias, extra_body=EXTRA, **PENALTIES) for c in clients]
    free = clients[0].completions.create(model=MODEL, prompt=SERVED_PROMPTS[0], max_tokens=40, temperature=0)
    plain, spec = replies
    assert [c.index for c in plain.choices] == [c.index for c in spec.choices] == [0, 1]
    assert plain.choices[0].text != free.choices[0].text  # the penalties and the bias changed it
    for p, s in zip(plain.choices, spec.choices):
        assert p.text == s.text == plain.choices[0].text  # greedy: both samples alike
        assert "".join(p.logprobs.tokens) == p.text and p.logprobs.text_offset[0] == 0
        assert all(len(top) in (3, 4) and tok in top for tok, top in zip(p.logprobs.tokens, p.logprobs.top_logprobs))
        same_completion_logprobs(p.logprobs, s.logprobs)
    assert plain.usage.completion_tokens == spec.usage.completion_tokens == 2 * len(plain.choices[0].logprobs.tokens)


def test_chat_logprobs_agree_and_stream_as_they_answer(clients):
    messages = [{"role": "user", "content": "def add(a, b):"}]
    args = dict(model=MODEL, messages=messages, max_tokens=30, temperature=0, logprobs=True, top_logprobs=2,
                frequency_penalty=0.3)
    plain, spec = (c.chat.completions.create(**args) for c in clients)
    a, b = plain.choices[0].logprobs.content, spec.choices[0].logprobs.content
    assert "".join(t.token for t in a) == plain.choices[0].message.content == spec.choices[0].message.content
    for x, y in zip(a, b):
        assert x.token == y.token and x.logprob == y.logprob and bytes(x.bytes).decode() == x.token
        assert x.top_logprobs == y.top_logprobs and len(x.top_logprobs) == 2
    streamed = []
    for chunk in clients[1].chat.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [t.token for t in streamed] == [t.token for t in b]
    assert [t.logprob for t in streamed] == [t.logprob for t in b]


def streamed_choices(client, **args) -> tuple[list[str], list[list[str]], list, int]:
    """A streamed request's (texts, logprob tokens, finish reasons) per choice index, and its usage."""
    n = args["n"]
    texts, tokens, finishes, used = [""] * n, [[] for _ in range(n)], [None] * n, None
    for chunk in client.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            tokens[choice.index] += choice.logprobs.tokens if choice.logprobs else []
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
        if chunk.usage:
            used = chunk.usage.completion_tokens
    return texts, tokens, finishes, used


def test_streamed_samples_equal_the_non_streamed_ones(clients):
    """Seeded samples repeat on a plain server, streamed or not; on the default server (rejection
    sampling, whose draws follow the adaptive schedule) each streamed choice is whole and its own."""
    args = dict(model=MODEL, prompt=SERVED_PROMPTS[2], max_tokens=24, temperature=0.9, seed=11, n=3, logprobs=1)
    whole = clients[0].completions.create(**args)
    texts, tokens, finishes, used = streamed_choices(clients[0], **args)
    assert texts == [c.text for c in whole.choices] and len(set(texts)) == 3
    assert tokens == [c.logprobs.tokens for c in whole.choices]
    assert finishes == [c.finish_reason for c in whole.choices] and used == whole.usage.completion_tokens
    texts, tokens, finishes, used = streamed_choices(clients[1], **args)
    assert len(set(texts)) == 3 and all(f in ("stop", "length") for f in finishes)
    assert all("".join(t).startswith(text) for t, text in zip(tokens, texts))
    assert used >= sum(len(t) for t in tokens)


def test_stop_token_ids_and_a_banned_token(clients):
    prompt = SERVED_PROMPTS[3]
    with build_engine(["speculative=none", "draft=none"]) as engine:
        (free,) = engine.generate(prompt, SamplingParams(max_new_tokens=30))
        ids, tokenizer = free.token_ids, engine.tokenizer
    stop = ids[5]
    first = ids.index(stop)
    for client in clients:
        stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0,
                                            extra_body={"stop_token_ids": [stop]})
        assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == first + 1
        assert stopped.choices[0].text == tokenizer.decode(ids[:first])
        banned = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0, logprobs=0,
                                           logit_bias={str(ids[0]): -100})
        assert banned.choices[0].logprobs.tokens[0] != tokenizer.token_text(ids[0])


def test_top_logprobs_without_logprobs_is_refused(clients):
    with pytest.raises(openai.BadRequestError) as refused:
        clients[0].chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    assert refused.value.body["param"] == "top_logprobs"


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                           "kind": {"enum": ["function", "class", "module"]}},
          "required": ["name", "age", "kind"], "additionalProperties": False}


def test_response_format_json_schema_and_json_object(clients):
    """Every output under a schema validates, greedy text is the same on both servers, and vLLM's
    guided_regex works too."""
    import jsonschema

    response_format = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}
    texts = []
    for client in clients:
        done = client.chat.completions.create(model=MODEL, max_tokens=80, temperature=0, response_format=response_format,
                                              messages=[{"role": "user", "content": "A record as JSON"}])
        texts.append(done.choices[0].message.content)
        jsonschema.validate(json.loads(texts[-1]), SCHEMA)
        sampled = client.completions.create(model=MODEL, prompt="CONFIG = ", max_tokens=80, temperature=0.9, seed=2,
                                            n=3, extra_body={"response_format": response_format})
        for choice in sampled.choices:
            jsonschema.validate(json.loads(choice.text), SCHEMA)
        anything = client.chat.completions.create(model=MODEL, max_tokens=60, temperature=0,
                                                  response_format={"type": "json_object"},
                                                  messages=[{"role": "user", "content": "JSON please"}])
        assert anything.choices[0].message.content.startswith("{")
        regex = client.completions.create(model=MODEL, prompt="x = ", max_tokens=20, temperature=0,
                                          extra_body={"guided_regex": r"[0-9]{1,4}\.[0-9]{2}"})
        assert re.fullmatch(r"[0-9]{1,4}\.[0-9]{2}", regex.choices[0].text)
    assert texts[0] == texts[1]


@pytest.mark.parametrize("fields,param", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}),
     "response_format"),
    (dict(response_format={"type": "yaml"}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format"),
    (dict(extra_body={"guided_regex": "(unclosed"}), "guided_regex"),
    (dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a+"}), "guided_regex"),
])
def test_structured_outputs_that_cannot_compile_are_refused(clients, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        clients[1].chat.completions.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}],
                                           **fields)
    assert refused.value.body["param"] == param


def test_streamed_logprobs_follow_the_text_a_stop_string_cuts(clients):
    """Logprobs stream with the text they belong to: text held back for a possible stop string holds
    its tokens' logprobs too, so a stream's entries are the non-streamed reply's, stop or not."""
    plain = clients[0]
    args = dict(model=MODEL, prompt=SERVED_PROMPTS[0], max_tokens=40, temperature=0, logprobs=1)
    free = plain.completions.create(**args).choices[0].text
    stop = free[len(free) // 2:len(free) // 2 + 12]  # characters from the middle, whole tokens among them
    for extra in ({}, {"stop": [stop]}):
        whole = plain.completions.create(**args, **extra).choices[0]
        texts, tokens, _, _ = streamed_choices(plain, **args, **extra, n=1)
        assert texts[0] == whole.text and tokens[0] == whole.logprobs.tokens
    assert whole.finish_reason == "stop" and len(whole.text) < len(free)
