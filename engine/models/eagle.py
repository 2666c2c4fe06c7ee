"""EAGLE-1/2 draft head: fc over [token embedding; target feature], one decoder layer, the target's lm_head.

Published layout: `fc.weight` [H, 2H] (and `fc.bias` when the head has one), `layers.0.*` without
`input_layernorm`; `embed_tokens.weight` optional (else the target's). The feature it reads and
predicts is the target's final, normed hidden state.
"""

import torch
from torch import nn

from engine.models.config import LlamaConfig
from engine.models.llama import LlamaDecoderLayer
from engine.models.rope import RotaryEmbedding


class EagleDraftModel(nn.Module):
    kind = "eagle"

    def __init__(self, config: LlamaConfig, fc_bias: bool):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0, input_norm=False)])
        self.rotary = RotaryEmbedding(config)
        self.embed_tokens: nn.Embedding | None = None  # shared with the target unless the head ships one
        self.lm_head: nn.Linear | None = None  # the target's

    def target_aux_layer_ids(self, num_target_layers: int) -> tuple[int, ...]:
        return ()

    def target_features(self, final_hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        return final_hidden  # [N, H]

    def forward(self, input_ids, positions, batch, features):
        # input_ids, positions: [N]; features: [N, H] -> (predicted features [N, H], [])
        x = self.fc(torch.cat((self.embed_tokens(input_ids), features.to(self.fc.weight.dtype)), dim=-1))
        return self.layers[0](x, positions, self.rotary, batch), []

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # [M, V] in target ids
