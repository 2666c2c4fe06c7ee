"""The engines the tests build and the requests they run: overrides per drafter and shape, the shared
prompts and params, and plain decoding's outputs that speculative runs must equal."""

import os
import random
from pathlib import Path

from eyas import SamplingParams
from eyas.engine.speculative.drafters.registry import ALGORITHMS, DRAFTERS, draft_kinds
from support import build_engine

PLAIN = ["speculative=none", "draft=none"]  # the default config speculates with the shipped heads
# the code prompts of the lossless checks, for every module without a reason for prompts of its own
PROMPTS = ["def add(a, b):", "import os", "class Point:\n    def __init__(self, x, y):", "for", "x = [1, 2, 3]"]
# a batch of 16 (PROMPTS first) for the checks at full batch: greedy and seeded sampled requests side
# by side, every one of which must emit plain decoding's tokens
PROMPTS_16 = [*PROMPTS, "while True:", "print(", "return self", "# a comment\n", "if x > 0:", "try:\n    ",
              "with open(", "lambda x:", "from typing import", "@property\ndef", "async def fetch("]
PARAMS_16 = [SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=t, top_p=p, seed=i)
             for i, (t, p) in enumerate([(0.0, 1.0), (0.8, 1.0), (1.0, 0.9), (0.0, 1.0)] * 4)]
# a batch of 16 prompts of code that repeats itself (unlike PROMPTS_16), so the n-gram and suffix lookups
# find matches in the prompt and in the output
REPEATING_PROMPTS = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
                     "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [", "for i in range(10):\n    print(i)\nfor j in range(",
                     "import os", "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.",
                     "if x > 0:\n    x = x - 1\nif y > 0:\n    y = y", "while True:", "return self",
                     "a = 1\nb = 2\nc = 3\nd =", "print('hello')\nprint('hello')\nprint(", "# a comment\n",
                     "with open(", "from typing import List\nfrom typing import", "lambda x: x + 1, lambda y:",
                     "try:\n    ", "async def fetch("]
# the verify mode of the speculative engines the tests build: seeded sampled output equal to plain
# decoding's, which most lossless checks compare against (rejection's are checked by distribution)
VERIFY = "reproducible"
# the EAGLE head an algorithm drafts with, its default draft kind (the registry's)
DRAFT_KIND = {name: row.draft_kinds[0] for name, row in DRAFTERS.items() if row.draft_kinds[0] in ("eagle", "eagle3")}
# EYAS_TEST_GRAPHS=compile (or aot): every engine the tests build runs its forwards as graphs
GRAPHS = [f"graphs.mode={os.environ['EYAS_TEST_GRAPHS']}"] if os.environ.get("EYAS_TEST_GRAPHS") else []


def engine_overrides(target, algorithm: str = "none", *extra: str, head: Path | str | None = None,
                     draft: str | None = None, num_steps: int | None = 3, topk: int = 1,
                     nodes: int | None = None) -> list[str]:
    """The overrides of an engine over `target` (None: the shipped target), `extra` last.

    algorithm "none": plain decoding. Otherwise speculation by `algorithm` at one fixed candidate
    (adaptive=off): `num_steps` draft steps, `topk` children per expanded node (1: a chain) and `nodes`
    tree nodes, the root counted; by default num_steps * topk + 1 (a chain: num_steps + 1), and for the
    hybrid's trees as many again for its n-gram branches. num_steps=None leaves the shape and the adaptive
    policy to the algorithm's config and `extra`. `head`: the draft model's directory, an EAGLE head of
    kind `draft` (by default the algorithm's own, eagle3 for the hybrid) or the standalone drafter's LM;
    n-gram lookup has none. Sampled requests verify as `VERIFY` unless `extra` sets `speculative.verify`.
    """
    overrides = [*GRAPHS] if target is None else [*GRAPHS, f"model.path={target}"]
    if algorithm == "none":
        return [*PLAIN, *overrides, *extra]
    overrides.append(f"speculative={algorithm}")
    if not any(e.startswith("speculative.verify=") for e in extra):
        overrides.append(f"speculative.verify={VERIFY}")
    kind = draft or DRAFT_KIND.get(algorithm)
    if kind is not None:
        overrides.append(f"draft={kind}")
    if head is not None:
        overrides.append(f"draft.path={head}")
    if num_steps is not None:
        if nodes is None:
            nodes = num_steps * topk + 1 + (num_steps * topk if algorithm == "hybrid" and topk > 1 else 0)
        overrides += ["adaptive=off", f"speculative.num_steps={num_steps}", f"speculative.topk={topk}",
                      f"speculative.num_draft_tokens={nodes}"]
    return [*overrides, *extra]


# one case per drafter of the registry (plain decoding first), for the checks every drafter must pass:
# a chain of 3 steps unless a drafter's case below gives it a shape of its own
DRAFTER_SHAPES = {"none": {}, "eagle3": dict(num_steps=3, topk=2, nodes=6), "suffix": dict(num_steps=6),
                  "standalone": dict(num_steps=2)}
DRAFTER_CASES = [(name, DRAFTER_SHAPES.get(name, dict(num_steps=3))) for name in ALGORITHMS]


def draft_head(algorithm: str, target, heads: dict):
    """The draft model a `spec_pair` run of `algorithm` drafts with, by its registry row: its EAGLE head,
    the target itself as a standalone LM, none without a draft model."""
    kind = draft_kinds(algorithm)[0]
    return {"none": None, "lm": target}.get(kind, heads.get(kind))


def run_plain(target, prompts, params, *extra: str) -> list:
    """Plain decoding of `prompts` (texts, or lists of token ids) on `target`, every KV page free after."""
    with build_engine(engine_overrides(target, "none", *extra)) as eng:
        if prompts and not isinstance(prompts, str) and not isinstance(prompts[0], str):
            outs = eng.generate(prompt_token_ids=prompts, sampling=params)
        else:
            outs = eng.generate(prompts, params)
        assert eng.scheduler.kv.all_free()
    return outs


class PlainReference:
    """`plain_reference(target, prompts, params, *extra)`: plain decoding's token ids per prompt, the
    reference speculative runs must equal; `.outputs(...)`: its whole outputs. Each run once a session,
    keyed on the target's path (None: the shipped target), the prompts, the params and the extra overrides."""

    def __init__(self):
        self.runs = {}

    def outputs(self, target, prompts, params, *extra: str) -> list:
        key = (str(target), repr(prompts), repr(params), extra)
        if key not in self.runs:
            self.runs[key] = run_plain(target, prompts, params, *extra)
        return self.runs[key]

    def __call__(self, target, prompts, params, *extra: str) -> list[list[int]]:
        return [o.token_ids for o in self.outputs(target, prompts, params, *extra)]


def random_requests_match_plain(target, overrides: list[str], count: int, seed: int, vocab: int = 320,
                                plain: tuple[str, ...] = ()) -> None:
    """`count` random requests (prompts, lengths, greedy or seeded sampling) through an engine built
    from `overrides`: every KV page and table entry is free afterwards, and every output equals plain
    decoding's (with the overrides `plain`)."""
    rng = random.Random(seed)
    prompts = [[0] + [rng.randrange(2, vocab) for _ in range(rng.randrange(1, 40))] for _ in range(count)]
    params = [SamplingParams(max_new_tokens=rng.randrange(1, 24), temperature=rng.choice([0.0, 0.8]), seed=i,
                             ignore_eos=rng.random() < 0.7) for i in range(count)]
    with build_engine(overrides) as eng:
        outs = eng.generate(prompt_token_ids=prompts, sampling=params)
        kv = eng.scheduler.kv
        assert kv.all_free() and (kv.table.table == -1).all()
    assert [o.token_ids for o in outs] == [o.token_ids for o in run_plain(target, prompts, params, *plain)]
