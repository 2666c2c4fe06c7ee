#!/usr/bin/env bash
# Rebuild the shipped models from scratch: corpus -> tokenizer -> target -> EAGLE / EAGLE-3 heads -> draft LM.
# Each step is resumable and prints where its output went. Run from anywhere; about 1.5 hours on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")"
python build_corpus.py "$@"
python train_tokenizer.py
python train_target.py
python train_heads.py
python train_target.py --config-name draft_lm
cp ../runs/corpus/heldout_files.txt ../engine/assets/heldout_files.txt
echo "shipped models written to $(cd ../engine/assets && pwd)"
