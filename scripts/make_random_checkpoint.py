"""Write a tiny random Llama checkpoint (Hugging Face layout, with a tokenizer) to try the engine on.

    python scripts/make_random_checkpoint.py /tmp/eyas-random

Uses `transformers` (the test extra) to write the checkpoint, so the engine loads exactly what
Hugging Face would save. Random weights: the text it generates means nothing.
"""

import argparse
from pathlib import Path

from eyas.testing.checkpoints import write_llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = write_llama(args.directory, num_layers=args.layers, hidden_size=args.hidden_size,
                       intermediate_size=2 * args.hidden_size, seed=args.seed)
    print(f"random checkpoint written to {path}")


if __name__ == "__main__":
    main()
