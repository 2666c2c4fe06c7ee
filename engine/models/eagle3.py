"""EAGLE-3 draft head (`LlamaForCausalLMEagle3`).

fc fuses three target hidden states (low / mid / high layers) into one feature; the single decoder
layer (`midlayer`) attends over [input_layernorm(embedding); hidden_norm(hidden)] (2H wide); its own
`lm_head` scores a reduced draft vocabulary, mapped back to target ids by `d2t`
(target_id = draft_id + d2t[draft_id]). The hidden passed from one draft step to the next is the
midlayer's output before `norm`.
"""

import torch
from torch import nn

from eyas.engine.models.config import ModelConfig
from eyas.engine.models.fused_linear import FusedLinear
from eyas.engine.models.llama import LlamaAttention, LlamaMLP, RMSNorm, layer_shapes
from eyas.engine.models.rope import RopeTables, RotaryEmbedding


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = LlamaAttention(config, 0, input_size=2 * config.hidden_size)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def pack(self, layouts: dict[str, str]) -> None:
        self.self_attn.pack(layouts)
        self.mlp.pack(layouts)

    def forward(self, embeds, hidden, rope: RopeTables, batch):
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)  # [N, 2H]
        hidden = self.self_attn(x, rope, batch, residual=hidden)
        return self.mlp(self.post_attention_layernorm(hidden), residual=hidden)


class Eagle3DraftModel(nn.Module):
    kind = "eagle3"

    def __init__(self, config: ModelConfig, target_hidden_size: int, draft_vocab_size: int,
                 aux_layer_ids: tuple[int, ...] | None = None):
        super().__init__()
        self.config = config
        self.draft_vocab_size = draft_vocab_size
        self.aux_layer_ids = aux_layer_ids
        self.target_hidden_size = target_hidden_size
        self.fc = nn.Linear(3 * target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = RotaryEmbedding(config)
        self.embed_tokens: nn.Embedding | None = None  # the target's unless the head ships one
        self.fc_proj = FusedLinear([self.fc])
        self.logits_proj = FusedLinear([self.lm_head])
        self._target_ids: torch.Tensor | None = None  # [Vd] draft id -> target id, made by `pack`

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        h = self.config.hidden_size
        return {**layer_shapes(self.config, input_size=2 * h), "fc": (3 * self.target_hidden_size, h),
                "lm_head": (h, self.draft_vocab_size)}

    def pack(self, layouts: dict[str, str]) -> None:
        self.fc_proj.pack(layouts["fc"])
        self.midlayer.pack(layouts)
        self.logits_proj.pack(layouts["lm_head"])
        self._target_ids = self.draft_token_ids()

    def target_aux_layer_ids(self, num_target_layers: int) -> tuple[int, ...]:
        if self.aux_layer_ids is not None:
            return tuple(self.aux_layer_ids)
        return (2, num_target_layers // 2, num_target_layers - 3)

    def target_features(self, final_hidden: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        return self.fc_proj(torch.cat(aux, dim=-1).to(self.fc.weight.dtype))  # [N, 3H_target] -> [N, H]

    def forward(self, input_ids, positions, batch, features):
        # features: fused target features or the previous step's hidden, [N, H] -> (hidden [N, H], [])
        embeds = self.embed_tokens(input_ids).to(features.dtype)
        rope = self.rotary.tables(positions, features.dtype, batch.max_position)
        return self.midlayer(embeds, features, rope, batch), []

    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t  # [Vd] target ids

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        table = self._target_ids if self._target_ids is not None else self.draft_token_ids()
        return table[draft_ids]  # draft-vocab ids -> target ids

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # [M, H] -> [M, Vd]: scores over the draft vocabulary (`draft_to_target` maps ids back)
        return self.logits_proj(self.norm(hidden)).float()
