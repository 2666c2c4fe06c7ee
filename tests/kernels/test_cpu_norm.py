"""eyas's one-pass RMSNorm op (`kernels/cpu_norm.cpp`): transformers' LlamaRMSNorm within float32 rounding,
a row computed alike alone or in any batch, and the module's choice of it kept for its life (no autograd
through the op: training keeps PyTorch's ops)."""

import pytest
import torch

from eyas.engine.cpu_ops import cpu_ops_error
from eyas.engine.models.llama import RMSNorm

if cpu_ops_error() is not None:
    pytest.skip(f"eyas's CPU kernels cannot be built here: {cpu_ops_error()}", allow_module_level=True)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, in float64."""
    x = x.double()
    return (weight.double() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))).float()


@pytest.mark.parametrize("hidden", [8, 64, 576, 77])
def test_op_equals_the_reference_and_rows_alone(hidden):
    generator = torch.Generator().manual_seed(hidden)
    x = torch.randn(70, hidden, generator=generator) * 3
    weight = torch.randn(hidden, generator=generator)
    out = torch.ops.eyas_cpu.rms_norm(x, weight, 1e-5)
    torch.testing.assert_close(out, reference(x, weight, 1e-5), rtol=1e-5, atol=1e-5)
    alone = torch.cat([torch.ops.eyas_cpu.rms_norm(x[i:i + 1], weight, 1e-5) for i in range(70)])
    assert torch.equal(out, alone)


def test_module_keeps_its_choice_and_trains_through_torch():
    norm = RMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(5, 64)
    with torch.inference_mode():
        fused = norm(x)
    assert norm._fused is True
    torch.testing.assert_close(fused, reference(x, norm.weight.detach(), 1e-6), rtol=1e-5, atol=1e-5)
    loss = norm(x.requires_grad_()).square().sum()  # grad mode: PyTorch's ops, so gradients reach the weight
    loss.backward()
    assert norm.weight.grad is not None and x.grad is not None
