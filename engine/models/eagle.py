"""EAGLE-1/2 draft head: fc over [token embedding; target feature], one decoder layer, the target's lm_head.

Published layout: `fc.weight` [H, 2H] (and `fc.bias` when the head has one), `layers.0.*` without
`input_layernorm`; `embed_tokens.weight` optional (else the target's). The feature it reads and
predicts is the target's final, normed hidden state.
"""

import torch
from torch import nn

from eyas.engine.models.config import ModelConfig
from eyas.engine.models.fused_linear import FusedLinear
from eyas.engine.models.llama import LlamaDecoderLayer, layer_shapes
from eyas.engine.models.rope import RotaryEmbedding


class EagleDraftModel(nn.Module):
    kind = "eagle"

    def __init__(self, config: ModelConfig, fc_bias: bool):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0, input_norm=False)])
        self.rotary = RotaryEmbedding(config)
        self.embed_tokens: nn.Embedding | None = None  # shared with the target unless the head ships one
        self.lm_head: nn.Linear | None = None  # the target's
        self.logits_proj: FusedLinear | None = None  # the target's
        self.fc_proj = FusedLinear([self.fc])

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        h = self.config.hidden_size
        return {**layer_shapes(self.config), "fc": (2 * h, h)}

    def share_target_lm_head(self, target) -> None:
        self.lm_head, self.logits_proj = target.lm_head, target.logits_proj

    def pack(self, layouts: dict[str, str]) -> None:
        self.fc_proj.pack(layouts["fc"])
        self.layers[0].pack(layouts)

    def target_aux_layer_ids(self, num_target_layers: int) -> tuple[int, ...]:
        return ()

    def target_features(self, final_hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        return final_hidden  # [N, H]

    def forward(self, input_ids, positions, batch, features):
        # input_ids, positions: [N]; features: [N, H] -> (predicted features [N, H], [])
        embeds = self.embed_tokens(input_ids)
        x = self.fc_proj(torch.cat((embeds, features.to(embeds.dtype)), dim=-1))
        return self.layers[0](x, self.rotary.tables(positions, x.dtype, batch.max_position), batch), []

    @property
    def draft_vocab_size(self) -> int:
        return self.config.vocab_size  # the target's vocabulary

    def draft_token_ids(self) -> torch.Tensor:
        device = self.layers[0].post_attention_layernorm.weight.device  # a norm's: fc's may be released (quantized)
        return torch.arange(self.config.vocab_size, device=device)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_proj(hidden).float()  # [M, V] in target ids
