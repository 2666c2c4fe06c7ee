"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a packed token layout.

Every forward takes the new tokens of all requests flattened to one dimension (`[N]`); attention
reads and writes the paged KV cache through the backend bound to the batch (`batch.attn_backend`).
Module names mirror Hugging Face's so checkpoints load without renaming. For inference, `pack`
fuses q/k/v and gate/up into single GEMMs (`FusedLinear`); residual adds ride in the GEMMs that
end each block (`addmm`), and RoPE tables are computed once per forward for all layers.
"""

import torch
from torch import nn
from torch.nn import functional as F

from eyas.engine.models.config import ModelConfig
from eyas.kernels import cpu_ops
from eyas.engine.models.fused_linear import FusedLinear
from eyas.engine.models.rope import RopeTables, RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self._constants: tuple[torch.Tensor, torch.Tensor] | None = None  # (hidden size, eps) as 0-dim tensors
        # eyas's one-pass CPU op for float32 rows (kernels/cpu_norm.cpp), decided at the first forward and
        # kept: a module computes every forward alike (a verify's rows as the decodes' rows)
        self._fused: bool | None = None

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """x / rms(x) over the last dim, back in x's dtype: the norm before its weight scales it."""
        # Hugging Face's LlamaRMSNorm: normalise in float32, cast back, then scale. The mean is sum / H,
        # which is how `mean` computes it (same bits); for a power-of-two H, eps + sum * (1 / H) is the
        # same number in one op (1 / H is exact). 0-dim tensor operands: Python scalars in these ops
        # cost two dtype conversions each.
        dtype = x.dtype
        if dtype != torch.float32:
            x = x.float()
        size, eps = self.constants_on(x.device)
        hidden = x.shape[-1]
        square_sum = (x * x).sum(-1, keepdim=True)
        if hidden & (hidden - 1) == 0:
            variance = torch.add(eps, square_sum, alpha=1.0 / hidden)
        else:
            variance = square_sum.div_(size).add_(eps)
        x = x * variance.rsqrt_()
        return x if dtype == torch.float32 else x.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fused is None:
            self._fused = x.device.type == "cpu" and self.weight.dtype == torch.float32 and cpu_ops.is_loaded()
        if self._fused and x.dim() == 2 and x.dtype == torch.float32 and not (
                torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):  # no autograd in the op
            return torch.ops.eyas_cpu.rms_norm(x.contiguous(), self.weight, self.eps)
        return self.weight * self.normalize(x)

    def constants_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._constants is None or self._constants[0].device != device:
            self._constants = (torch.tensor(float(self.weight.shape[0]), device=device),
                               torch.tensor(self.eps, device=device))
        return self._constants


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, input_size: int | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.qkv_bias
        h, x = config.hidden_size, input_size or config.hidden_size
        self.q_proj = nn.Linear(x, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(x, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(x, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self._qk_norm_weight: torch.Tensor | None = None  # [Hq + Hkv, D]: q_norm's rows, then k_norm's
        self.qkv = FusedLinear([self.q_proj, self.k_proj, self.v_proj])
        self.out = FusedLinear([self.o_proj])

    def pack(self, layouts: dict[str, str]) -> None:
        self.qkv.pack(layouts["qkv"])
        self.out.pack(layouts["o"])
        if self.qk_norm:
            self._qk_norm_weight = self._stacked_qk_norm_weight()

    def _stacked_qk_norm_weight(self) -> torch.Tensor:
        d = self.head_dim
        return torch.cat((self.q_norm.weight.expand(self.num_heads, d), self.k_norm.weight.expand(self.num_kv_heads, d)))

    def _norm_qk(self, qk: torch.Tensor) -> torch.Tensor:
        # qk: [N, Hq + Hkv, D]; each head normalised on its own, q heads scaled by q_norm, k heads by k_norm
        weight = self._qk_norm_weight if self._qk_norm_weight is not None else self._stacked_qk_norm_weight()
        return weight * self.q_norm.normalize(qk)

    def forward(self, x, rope: RopeTables, batch, residual=None):
        # x: [N, in] -> residual + attention output, [N, H]
        n = x.shape[0]
        qk_width = (self.num_heads + self.num_kv_heads) * self.head_dim
        qkv = self.qkv(x)  # [N, (Hq + 2 Hkv) D]
        qk = qkv[:, :qk_width].view(n, self.num_heads + self.num_kv_heads, self.head_dim)
        qk = rope.apply(self._norm_qk(qk) if self.qk_norm else qk)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, qk_width:].view(n, self.num_kv_heads, self.head_dim)
        out = batch.attn_backend.forward(q, k, v, self.layer_id, batch)  # [N, Hq, D]
        return self.out(out.reshape(n, self.num_heads * self.head_dim), residual)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.gate_up = FusedLinear([self.gate_proj, self.up_proj])
        self.down = FusedLinear([self.down_proj])

    def pack(self, layouts: dict[str, str]) -> None:
        self.gate_up.pack(layouts["gate_up"])
        self.down.pack(layouts["down"])

    def forward(self, x, residual=None):
        gate_up = self.gate_up(x)  # [N, 2I]
        i = gate_up.shape[-1] // 2
        return self.down(F.silu(gate_up[:, :i]) * gate_up[:, i:], residual)


def layer_shapes(config: ModelConfig, input_size: int | None = None) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of a decoder layer's fused projections, by `pack` layout name."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    return {"qkv": (input_size or h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * i), "down": (i, h)}


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, input_norm: bool = True):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id)
        self.mlp = LlamaMLP(config)
        # EAGLE-1/2 heads feed the fc output straight into attention: no input norm
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if input_norm else nn.Identity()
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def pack(self, layouts: dict[str, str]) -> None:
        self.self_attn.pack(layouts)
        self.mlp.pack(layouts)

    def forward(self, x, rope: RopeTables, batch):
        x = self.self_attn(self.input_layernorm(x), rope, batch, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)

    def forward(self, input_ids, positions, batch, aux_layer_ids=()):
        # input_ids, positions: [N] -> hidden [N, H], plus the residual stream entering each aux layer
        x = self.embed_tokens(input_ids)
        rope = self.rotary.tables(positions, x.dtype, batch.max_position)
        captured = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layer_ids:
                captured[i] = x
            x = layer(x, rope, batch)
        return self.norm(x), [captured[i] for i in aux_layer_ids]


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logits_proj = FusedLinear([self.lm_head])

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        return {**layer_shapes(self.config), "lm_head": (self.config.hidden_size, self.config.vocab_size)}

    def pack(self, layouts: dict[str, str]) -> None:
        """Fuse projections for inference (see `FusedLinear`); a dense tied lm_head keeps the embedding's layout."""
        for layer in self.model.layers:
            layer.pack(layouts)
        tied = self.lm_head.weight is self.model.embed_tokens.weight
        if not tied:
            self.logits_proj.pack(layouts["lm_head"])
        elif layouts["lm_head"] in ("transposed", "linear"):
            self.logits_proj.pack("linear")  # the embedding's own tensor
        else:
            self.logits_proj.pack(layouts["lm_head"], release=False)  # a compressed copy; the embedding stays

    def forward(self, input_ids, positions, batch, aux_layer_ids: tuple[int, ...] = ()):
        """aux_layer_ids: layers whose input is returned beside the final hidden state (an EAGLE-3
        head's features), as the runner was told when it was built."""
        return self.model(input_ids, positions, batch, aux_layer_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [M, H] -> logits [M, V] in float32
        return self.logits_proj(hidden).float()
