"""eyas against transformers on the same GGUF file: greedy tokens on held-out chat prompts, one process.

    python scripts/check_gguf_oracle.py [--num-prompts 8] [--max-new-tokens 96] [model.path=/x/model.gguf]

Both run the dequantized float32 model (eyas: `model.quantization=none`; transformers:
`from_pretrained(dir, gguf_file=...)`) from the same token ids (the prompt rendered with the file's chat
template by eyas's tokenizer), greedy, stopping at the model's end of turn. Prints, per prompt, whether the
token ids are equal and where they first differ, and the count of equal prompts. Needs transformers.
"""

import argparse

import torch

from eyas import SamplingParams, build_engine
from eyas.bench.workloads import chat_messages, chat_prompts_for
from eyas.engine.models.checkpoint_source import checkpoint_directory, gguf_source
from eyas.launch.compose import compose_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("override", nargs="*", help="config overrides naming the GGUF target (default: the default model, smollm2)")
    args = p.parse_args()
    overrides = args.override
    path = compose_config(overrides)["model"]["path"]
    meta = checkpoint_directory(path)
    file = gguf_source(meta)
    if file is None:
        raise SystemExit(f"model.path={path} is not a GGUF file")
    texts = chat_prompts_for(chat_messages(args.num_prompts), overrides)
    with build_engine([*overrides, "prompt=null", "speculative=none", "draft=none", "model.quantization=none",
                       "model.dtype=float32"]) as eng:
        ids = [eng.tokenizer.encode(t) for t in texts]
        ours = [o.token_ids for o in eng.generate(prompt_token_ids=ids,
                                                  sampling=SamplingParams(max_new_tokens=args.max_new_tokens))]
        eos = set(eng.stop_checker.eos_token_ids)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32).eval()
    equal = 0
    for i, (prompt, mine) in enumerate(zip(ids, ours)):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=args.max_new_tokens, do_sample=False,
                              eos_token_id=sorted(eos) or None, pad_token_id=0)
        theirs = out[0, len(prompt):].tolist()
        first = next((j for j, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        same = mine == theirs
        equal += same
        print(f"prompt {i}: {'equal' if same else 'differs'} ({len(mine)} / {len(theirs)} tokens"
              f"{'' if first is None else f', first difference at token {first}'})", flush=True)
    print(f"{equal} of {len(ids)} prompts: eyas's greedy tokens equal transformers' ({file.name}, float32)")


if __name__ == "__main__":
    main()
