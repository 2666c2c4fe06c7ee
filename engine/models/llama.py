"""Llama-family target model over a packed token layout.

Every forward takes the new tokens of all requests flattened to one dimension (`[N]`); attention
reads and writes the paged KV cache through the backend bound to the batch (`batch.attn_backend`).
Module names mirror Hugging Face's so checkpoints load without renaming.
"""

import torch
from torch import nn
from torch.nn import functional as F

from engine.models.config import LlamaConfig
from engine.models.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_id: int, input_size: int | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        h, x = config.hidden_size, input_size or config.hidden_size
        self.q_proj = nn.Linear(x, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(x, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(x, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)

    def forward(self, x, positions, rotary, batch):
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        q, k = rotary(positions, q, k)
        out = batch.attn_backend.forward(q, k, v, self.layer_id, batch)  # [N, Hq, D]
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_id: int, input_norm: bool = True):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id)
        self.mlp = LlamaMLP(config)
        # EAGLE-1/2 heads feed the fc output straight into attention: no input norm
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if input_norm else nn.Identity()
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, positions, rotary, batch):
        x = x + self.self_attn(self.input_layernorm(x), positions, rotary, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)

    def forward(self, input_ids, positions, batch, aux_layer_ids=()):
        # input_ids, positions: [N] -> hidden [N, H], plus the residual stream entering each aux layer
        x = self.embed_tokens(input_ids)
        captured = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layer_ids:
                captured[i] = x
            x = layer(x, positions, self.rotary, batch)
        return self.norm(x), [captured[i] for i in aux_layer_ids]


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.aux_layer_ids: tuple[int, ...] = ()  # layers whose input an EAGLE-3 head reads

    def forward(self, input_ids, positions, batch):
        return self.model(input_ids, positions, batch, self.aux_layer_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [M, H] -> logits [M, V] in float32
        return self.lm_head(hidden).float()
