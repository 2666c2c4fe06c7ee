"""Speculation under a JSON schema: tau and tokens/s with the drafts masked by the grammar and without,
against plain decoding under the same schema.

    python -m eyas.bench structured                       # greedy, batch 1
    python -m eyas.bench structured --temperature 0.8 --batch-sizes 1,8
    python -m eyas.bench structured --mask-cost           # llguidance's per-token mask cost (and xgrammar's)

Held-out standard-library prompts, each followed by a request to describe the code as a JSON record
of `SCHEMA`. Configurations: `plain`, `default` (adaptive EAGLE-3) and `k=3` (a fixed EAGLE-3 chain),
each with `speculative.mask_drafts` true (the head drafts under the grammar's mask, rejected drafts cut
before verification) and false (only the target's choices masked). Waves of prompts run on every
configuration in turn, the order rotating (`bench_sampled.run_waves`). Every output is checked against
the schema.
"""

import argparse
import json
import time
from pathlib import Path

from eyas import SamplingParams
from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.sampled import Contender, compared, run_waves
from eyas.engine.assets import asset_path
from eyas.prompts.heldout import heldout_prompts

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "kind": {"enum": ["function", "method", "class"]},
        "arguments": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 5},
        "returns": {"type": "string", "maxLength": 24},
        "has_docstring": {"type": "boolean"},
    },
    "required": ["name", "kind", "arguments", "returns", "has_docstring"],
    "additionalProperties": False,
}
ASK = "\n# The code above, as a JSON record:\n"
CONFIGS = {
    "plain": ["speculative=none", "draft=none"],
    "default": [],
    "k=3": ["adaptive=off", "speculative.num_steps=3", "speculative.num_draft_tokens=4"],
}


def valid(text: str) -> bool:
    try:
        record = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:  # parsing alone
        return isinstance(record, dict)
    try:
        jsonschema.validate(record, SCHEMA)
        return True
    except jsonschema.ValidationError:
        return False


def unpack(bitmask, vocab_size: int):
    """[1, ceil(V / 32)] int32 words (bit i of word w: token 32 w + i allowed) -> [V] bool."""
    import torch

    return ((bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).bool().flatten(1)[0, :vocab_size]


def mask_cost(steps: int = 300) -> None:
    """Median and mean time of one next-token bitmask over the shipped tokenizer (each engine's own
    call, filling 32 tokens per int32 word), walking random valid continuations of SCHEMA: llguidance
    (what eyas uses) and, when installed, xgrammar."""
    import random

    import torch

    from eyas.engine.models.config import read_json
    from eyas.engine.structured.grammars import JSON_LAYOUT

    tokenizer_file = Path(asset_path("target")) / "tokenizer.json"
    vocab = read_json(Path(asset_path("target")) / "config.json")["vocab_size"]

    def walk(fill, consume, finished, reset, name):
        rng, times = random.Random(0), []
        while len(times) < steps:
            reset()
            for _ in range(80):
                start = time.perf_counter()
                bitmask = fill()
                times.append(time.perf_counter() - start)
                choices = [t for t in unpack(bitmask, vocab).nonzero().flatten().tolist() if t < vocab]
                if not choices or not consume(rng.choice(choices)) or finished():
                    break
        times.sort()
        print(f"{name:>12}: {len(times)} masks, median {1e6 * times[len(times) // 2]:.0f} us, "
              f"p90 {1e6 * times[int(0.9 * len(times))]:.0f} us, mean {1e6 * sum(times) / len(times):.0f} us")

    import llguidance

    tokenizer = llguidance.LLTokenizer(tokenizer_file.read_text(), n_vocab=vocab)
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_LAYOUT))
    words = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)

    def ll_fill():
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        return words

    walk(ll_fill, matcher.consume_token, matcher.is_stopped, matcher.reset, "llguidance")
    try:
        import xgrammar
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        print("    xgrammar: not installed (pip install xgrammar)")
        return
    info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file)),
                                                   vocab_size=vocab)
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    xmatcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, vocab)

    def xg_fill():
        xmatcher.fill_next_token_bitmask(bitmask)
        return bitmask

    walk(xg_fill, xmatcher.accept_token, xmatcher.is_terminated, xmatcher.reset, "xgrammar")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eyas.bench structured", description=__doc__.split("\n\n")[0])
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--configs", default="default,k=3")
    p.add_argument("--num-prompts", type=int, default=12, help="per batch size: max(this, 2 x batch size)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="room for the longest record SCHEMA allows")
    p.add_argument("--mask-cost", action="store_true", help="time the grammar engines' masks and stop")
    add_out_argument(p, "structured")
    args = p.parse_args(argv)
    if args.mask_cost:
        mask_cost()
        return
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS or n == "plain"]
    if unknown:
        raise SystemExit(f"--configs: unknown configuration {unknown[0]!r}; choose from default, k=3")
    print(f"held-out code prompts + a JSON-record request x up to {args.max_new_tokens} new tokens, "
          f"T={args.temperature}; tau = tokens per verify cycle, bonus included", flush=True)
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        prompts = [p + ASK for p in heldout_prompts(max(args.num_prompts, 2 * batch_size))]
        params = [SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=i,
                                 structured_output={"json_schema": SCHEMA}) for i in range(len(prompts))]
        common = [f"cache.max_running_requests={batch_size}", f"cache.max_total_tokens={max(8192, 512 * batch_size)}"]
        contenders = [Contender("plain", [*CONFIGS["plain"], *common])]
        for name in names:
            for masked in ("true", "false"):
                contenders.append(Contender(f"{name} mask_drafts={masked}",
                                            [*CONFIGS[name], f"speculative.mask_drafts={masked}", *common]))
        run_waves(contenders, prompts, params, batch_size)
        texts = {c.name: [c.engine.tokenizer.decode(ids) for ids in c.outputs] for c in contenders}
        rows = compared(contenders)
        plain = rows["plain"]["tokens_per_s"]
        print(f"\nbatch {batch_size}: {len(prompts)} prompts, plain {plain:.1f} tok/s")
        print(f"{'config':>26} {'tok/s':>7} {'vs plain':>8} {'tau':>5}  same tokens as plain  valid outputs")
        for c in contenders:
            r = rows[c.name]
            tau = f"{r['tau']:.2f}" if "tau" in r else "-"
            r.update(valid=sum(valid(t) for t in texts[c.name]), outputs=len(texts[c.name]))
            print(f"{c.name:>26} {r['tokens_per_s']:>7.1f} {r['vs_plain']:>7.2f}x {tau:>5}  "
                  f"{'yes' if r['same_as_plain'] else 'no':>20}  {r['valid']}/{r['outputs']}", flush=True)
        results[f"batch {batch_size}"] = rows
        for c in contenders:
            c.engine.close()
    table = [{"setting": setting, "config": config, **scalars(row)} for setting, rows in results.items()
             for config, row in rows.items()]
    write_record(args.out, "structured", argv, table, results)


if __name__ == "__main__":
    main()
