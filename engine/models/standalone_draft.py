"""A small causal LM that shares the target's tokenizer, loaded as a drafter (`speculative=standalone`).

`StandaloneDraftModel` gives the LM the draft model interface the draft worker runs (the one EAGLE
heads have): `forward(input_ids, positions, batch, features)` ignores the features, ids are target
ids, and the LM's own final hidden state stands for the features it never reads.
"""

from pathlib import Path

import torch
from torch import nn

from eyas.engine.errors import CheckpointError
from eyas.engine.models.llama import LlamaForCausalLM
from eyas.engine.models.loader import checkpoint_dir, load_model


class StandaloneDraftModel(nn.Module):
    kind = "lm"

    def __init__(self, lm: LlamaForCausalLM):
        super().__init__()
        self.lm = lm
        self.config = lm.config
        self.num_kv_layers = lm.config.num_hidden_layers  # the draft KV pool's layers (an EAGLE head has one)

    @property
    def draft_vocab_size(self) -> int:
        return self.config.vocab_size

    def forward(self, input_ids, positions, batch, features=None):
        # input_ids, positions: [N] -> (final hidden [N, H], [])
        hidden, _ = self.lm(input_ids, positions, batch)
        return hidden, []

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.compute_logits(hidden)  # [M, V] float32, target ids

    def target_features(self, final_hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        return final_hidden  # never read: the LM sees tokens only

    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.config.vocab_size, device=self.lm.model.embed_tokens.weight.device)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids


def load_standalone_draft(path: str | Path, target: LlamaForCausalLM, dtype: str = "auto",
                          device: str | torch.device = "cpu", weight_layout: str = "auto",
                          target_path: str | Path | None = None, quantization: str = "none",
                          quantization_group_size: int = 128) -> StandaloneDraftModel:
    """Load the LM at `path`; it must have the target's vocabulary (and, where both ship one, its tokenizer)."""
    directory = checkpoint_dir(path)
    torch_dtype = str(target.lm_head.weight.dtype).removeprefix("torch.") if dtype == "auto" else dtype
    lm = load_model(directory, torch_dtype, device, weight_layout, quantization, quantization_group_size, "draft",
                    runs_beside=target)
    if lm.config.vocab_size != target.config.vocab_size:
        raise CheckpointError(f"{directory}: the draft LM's vocab_size is {lm.config.vocab_size} but the target's is "
                              f"{target.config.vocab_size}: a standalone drafter needs the target's tokenizer "
                              "(set draft.path to a small LM trained with it)")
    if target_path is not None:
        ours, theirs = directory / "tokenizer.json", Path(target_path) / "tokenizer.json"
        if ours.is_file() and theirs.is_file() and ours.read_bytes() != theirs.read_bytes():
            raise CheckpointError(f"{directory}: tokenizer.json differs from the target's ({theirs}): a standalone "
                                  "drafter needs the target's tokenizer")
    return StandaloneDraftModel(lm).eval().requires_grad_(False)
