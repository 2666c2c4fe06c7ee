"""Structured output: every output follows its grammar (JSON schemas validated, regexes matched), with
and without speculation alike, for every drafter; drafts follow the grammar; errors name the field."""

import json
import re

import jsonschema
import pytest
from support import build_engine
from support.engines import PROMPTS, engine_overrides, run_plain

from eyas import ConfigError, SamplingParams

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                      "kind": {"enum": ["function", "class", "module"]}},
     "required": ["name", "age", "kind"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "maxItems": 3,
                                                                          "items": {"type": "string", "maxLength": 6}}},
     "required": ["ok", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"],
        "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                      "code": {"type": "string", "pattern": "^[a-z]{2,4}$"}},
     "required": ["value", "code"], "additionalProperties": False},
]
REGEX = r"(def|class) [a-z_]{1,16}\(\):"
SHIPPED_PROMPTS = ["Return the record as JSON:\n", "def to_json(self):\n    return ", "# config\nCONFIG = "]
DRAFTERS = {"eagle-chain": ("eagle", 1), "eagle3-tree": ("eagle3", 3), "ngram": ("ngram", 1), "hybrid-tree": ("hybrid", 2)}


def structured(spec, **extra) -> SamplingParams:
    return SamplingParams(max_new_tokens=80, structured_output=spec, **extra)


@pytest.mark.parametrize("config", ["plain", "default"])
def test_every_output_validates_against_its_schema(config):
    """The shipped model (which never saw JSON) under each schema, greedy and sampled: each output
    parses, validates and ends where its schema is complete; a regex output matches in full."""
    overrides = ["speculative=none", "draft=none"] if config == "plain" else []
    with build_engine(overrides) as eng:
        for schema in SCHEMAS:
            for params in (structured({"json_schema": schema}), structured({"json_schema": schema}, temperature=0.8, seed=3)):
                for out in eng.generate(SHIPPED_PROMPTS, params):
                    assert out.finish_reason == "stop", (schema, out.text)
                    jsonschema.validate(json.loads(out.text), schema)
        # any object: unbounded strings, so a sampled one may run to max_new_tokens; what ends, parses
        # (three seeds: which draws run long depends on the drafts, under rejection verification)
        objects = [o for seed in (1, 2, 3)
                   for o in eng.generate(SHIPPED_PROMPTS, structured({"json_object": True}, temperature=0.8, seed=seed))]
        ended = [o for o in objects if o.finish_reason == "stop"]
        assert ended and all(isinstance(json.loads(o.text), dict) for o in ended)
        assert all(o.text.startswith("{") for o in objects)
        for out in eng.generate(SHIPPED_PROMPTS, structured({"regex": REGEX})):
            assert re.fullmatch(REGEX, out.text) and out.finish_reason == "stop"
        assert eng.scheduler.kv.all_free()


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_structured_output_equals_plain_for_every_drafter(spec_pair, drafter):
    target, heads = spec_pair
    algorithm, topk = DRAFTERS[drafter]
    specs = [{"json_schema": SCHEMAS[0]}, {"json_schema": SCHEMAS[3]}, {"regex": REGEX}]
    params = [structured(spec) for spec in specs for _ in PROMPTS[:2]]
    prompts = PROMPTS[:2] * len(specs)
    plain = run_plain(target, prompts, params)
    head = heads.get("eagle3" if algorithm == "hybrid" else algorithm)
    with build_engine(engine_overrides(target, algorithm, head=head, num_steps=4 if topk == 1 else 3, topk=topk)) as eng:
        outs = eng.generate(prompts, params)
        assert eng.scheduler.kv.all_free()
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for out, p in zip(plain, params):
        if "regex" in p.structured_output:
            assert re.fullmatch(REGEX, out.text)
        else:
            jsonschema.validate(json.loads(out.text), p.structured_output["json_schema"])


@pytest.mark.parametrize("algorithm", ["eagle3", "ngram"])
def test_seeded_structured_sampling_equals_plain_under_reproducible_verify(spec_pair, algorithm):
    target, heads = spec_pair
    params = [structured({"json_schema": SCHEMAS[1]}, temperature=0.9, seed=s) for s in range(4)]
    prompts = PROMPTS[:4]
    plain = run_plain(target, prompts, params)
    with build_engine(engine_overrides(target, algorithm, head=heads.get(algorithm), num_steps=3)) as eng:
        assert [o.token_ids for o in eng.generate(prompts, params)] == [o.token_ids for o in plain]


@pytest.mark.parametrize("topk", [1, 3], ids=["chain", "tree"])
def test_drafts_that_follow_the_grammar_are_accepted_more_with_the_same_output(spec_pair, topk):
    """speculative.mask_drafts=false leaves the head's drafts unmasked (the target's masked choice
    turns the bad ones down): the same tokens, fewer of the drafts accepted. Chains mask each draft
    step, trees each expanded node's children."""
    target, heads = spec_pair
    params = structured({"json_schema": SCHEMAS[0]})
    runs = {}
    for masked in (True, False):
        with build_engine(engine_overrides(target, "eagle3", f"speculative.mask_drafts={str(masked).lower()}",
                                           head=heads["eagle3"], num_steps=4 if topk == 1 else 3, topk=topk)) as eng:
            outs = eng.generate(PROMPTS, params)
            runs[masked] = ([o.token_ids for o in outs], eng.metrics()["mean_accept_length"])
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > runs[False][1]


@pytest.mark.parametrize("algorithm", ["ngram", "suffix"])
def test_the_tokens_a_grammar_forces_fill_a_lookup_chain_past_its_drafts(spec_pair, algorithm):
    """A lookup drafter's chain is cut at its first draft the grammar rejects (or where its match ends)
    and, with mask_drafts, filled from there with the tokens the grammar forces (a record's keys and
    punctuation): plain decoding's tokens, more of them accepted per cycle than with the cut alone."""
    target = spec_pair[0]
    params = [structured({"json_schema": SCHEMAS[i]}) for i in (0, 2)]
    prompts = PROMPTS[:2]
    plain = run_plain(target, prompts, params)
    runs = {}
    for masked in (True, False):
        with build_engine(engine_overrides(target, algorithm, f"speculative.mask_drafts={str(masked).lower()}",
                                           num_steps=6)) as eng:
            outs = eng.generate(prompts, params)
            runs[masked] = eng.metrics()["mean_accept_length"]
            assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert runs[True] > runs[False] + 0.5, runs
    sampled = [structured({"json_schema": SCHEMAS[i]}, temperature=0.9, seed=i) for i in (0, 2)]
    for masked in (True, False):  # filled drafts verified by rejection sampling
        with build_engine(engine_overrides(target, algorithm, "speculative.verify=rejection",
                                           f"speculative.mask_drafts={str(masked).lower()}", num_steps=6)) as eng:
            for out, p in zip(eng.generate(prompts, sampled), sampled):
                jsonschema.validate(json.loads(out.text), p.structured_output["json_schema"])
            runs[masked] = eng.metrics()["mean_accept_length"]
    assert runs[True] > runs[False], runs


def test_a_forced_chain_keeps_the_allowed_drafts_then_takes_what_the_grammar_forces():
    from pathlib import Path

    from eyas.engine.assets import asset_path
    from eyas.engine.structured.grammars import GrammarCompiler
    from eyas.engine.tokenizer import Tokenizer

    directory = Path(asset_path("target"))
    tokenizer = Tokenizer.from_dir(directory)
    compiler = GrammarCompiler((directory / "tokenizer.json").read_text(), 4096, tokenizer.eos_token_ids)
    grammar = compiler.matcher({"json_schema": SCHEMAS[2]})  # {"point":{"x":<number>,"y":<0-9>}}
    forced = grammar.matcher.compute_ff_tokens()  # from the start: {"point":{"x":
    assert tokenizer.decode(forced) == '{"point":{"x":'
    brace = forced[0]
    grammar.consume([brace])  # the chain's root: emitted already
    filled = grammar.forced_chain([brace] + [brace] * 12)  # a second "{" is no key: rejected at once
    assert filled == [brace] + forced[1:] + [-1] * (12 - len(forced) + 1) and grammar.num_consumed == 1
    valid, _ = grammar.walk(filled, list(range(-1, len(filled) - 1)))
    assert valid == [True] + [t >= 0 for t in filled[1:]]  # every forced token is allowed where it stands
    other = tokenizer.encode('"point"')[-3:]  # allowed drafts, tokenized otherwise, stay as they are
    kept = grammar.forced_chain([brace, *other, brace, brace])
    assert kept[:4] == [brace, *other] and tokenizer.decode([t for t in kept if t >= 0]).startswith('{"point":{')


@pytest.mark.parametrize("spec,message", [
    ({"json_schema": {"type": "object"}, "regex": "a"}, r"sampling.structured_output must have exactly one of the keys"),
    ({"yaml": "x"}, r"sampling.structured_output must have exactly one of the keys"),
    ({"json_object": False}, r"sampling.structured_output.json_object must be true"),
    ({"regex": ""}, r"sampling.structured_output.regex must be a non-empty string"),
])
def test_malformed_specs_name_the_field(spec, message):
    with pytest.raises(ConfigError, match=message):
        structured(spec)


@pytest.mark.parametrize("spec,field", [
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}, "json_schema"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"regex": "(unclosed"}, "regex"),
    ({"grammar": "start: undefined_rule"}, "grammar"),
])
def test_grammars_that_cannot_compile_are_refused_before_anything_runs(gqa_checkpoint, spec, field):
    with build_engine(engine_overrides(gqa_checkpoint)) as eng:
        with pytest.raises(ConfigError, match=rf"sampling.structured_output.{field}"):
            eng.generate(["def f():", "x = 1"], [SamplingParams(max_new_tokens=2), structured(spec)])
        assert not eng.has_work() and eng.scheduler.kv.all_free()


def test_degenerate_sampling_values_stay_within_the_grammar(spec_pair):
    """A temperature too small to divide by samples as greedy, and a top_p that rounds to 0 keeps the
    best token: no row without a choice reaches the grammar."""
    target, _ = spec_pair
    with pytest.raises(ConfigError, match="sampling.temperature must be a finite number"):
        SamplingParams(temperature=float("inf"))
    greedy = run_plain(target, PROMPTS[:2], structured({"regex": REGEX}))
    for params in (structured({"regex": REGEX}, temperature=1e-40, seed=1), structured({"regex": REGEX}, temperature=0.9,
                                                                                       top_p=1e-300, seed=2)):
        outs = run_plain(target, PROMPTS[:2], params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in greedy]  # both reduce to the argmax


def test_a_token_the_grammar_refuses_fails_its_request_alone(spec_pair):
    target, heads = spec_pair
    with build_engine(engine_overrides(target, "eagle", head=heads["eagle"])) as eng:
        broken, fine = eng.submit(PROMPTS[:2], [structured({"json_object": True}), SamplingParams(max_new_tokens=8)])
        broken.grammar.consume = lambda tokens: setattr(broken.grammar, "error", "refused token")  # as if refused
        while eng.has_work():
            eng.step()
        assert broken.finish_reason == "error" and broken.error == "refused token"
        assert fine.finish_reason == "length" and len(fine.output_ids) == 8 and eng.scheduler.kv.all_free()
