"""Train a byte-level BPE tokenizer on the corpus' train split; write `tokenizer.json`.

    python scripts/train_tokenizer.py [vocab_size=4096]
"""

import json

import hydra
from omegaconf import DictConfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from training.paths import resolve


@hydra.main(config_path="conf", config_name="tokenizer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    docs = json.loads((resolve(cfg.corpus_dir) / "train.json").read_text())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=[cfg.bos_token, cfg.eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True,
    )
    tok.train_from_iterator((d["text"] for d in docs), trainer)
    bos_id = tok.token_to_id(cfg.bos_token)
    tok.post_processor = processors.TemplateProcessing(single=f"{cfg.bos_token} $A", special_tokens=[(cfg.bos_token, bos_id)])
    out_dir = resolve(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"bos_token": cfg.bos_token, "eos_token": cfg.eos_token}))
    print(f"vocab {tok.get_vocab_size()}; tokenizer written to {out_dir}")


if __name__ == "__main__":
    main()
