#!/usr/bin/env bash
# Rebuild the EAGLE-3 head of SmolLM2-135M-Instruct: self-distilled answers -> target features -> head.
# Each step is resumable (shard by shard, then from the last saved training state); the target is fetched
# once like `model=smollm2` does (or set EYAS_SMOLLM2_GGUF to a local copy of the GGUF file). Arguments are
# passed to the training step (e.g. device=cuda train.steps=1200).
set -euo pipefail
cd "$(dirname "$0")"
python distill.py
python distill_features.py
python train_eagle3.py "$@"
echo "head written to $(cd ../engine/assets && pwd)/smollm2-eagle3"
