"""The CPU GEMM of the blocked weight layout (kernels/cpu_gemm.cpp) against torch."""

import pytest
import torch

from eyas.engine.cpu_ops import cpu_ops_error
from eyas.kernels import cpu_gemm


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_ops_error() is None  # built (or found) in the test run's cache root


@pytest.mark.parametrize("n,k", [(16, 16), (37, 13), (256, 80), (1000, 300), (5, 1)])
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 40])
def test_blocked_linear_equals_torch(n, k, rows):
    generator = torch.Generator().manual_seed(n * 1000 + k * 10 + rows)
    weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
    x, residual = torch.randn(rows, k, generator=generator), torch.randn(rows, n, generator=generator)
    packed = cpu_gemm.pack(weight)
    assert packed.shape == (-(-n // cpu_gemm.BLOCK), k, cpu_gemm.BLOCK)
    expected = x.double() @ weight.double().t()
    tolerance = dict(atol=1e-4 * k ** 0.5, rtol=1e-5)
    torch.testing.assert_close(cpu_gemm.blocked_linear(x, packed, n).double(), expected, **tolerance)
    torch.testing.assert_close(cpu_gemm.blocked_linear(x, packed, n, bias, residual).double(),
                               expected + bias.double() + residual.double(), **tolerance)


def test_every_row_computes_as_it_does_alone():
    # one FMA chain per output whatever the tile a row falls in: a batch's rows are its lone rows bit for bit
    generator = torch.Generator().manual_seed(3)
    weight, x = torch.randn(200, 96, generator=generator), torch.randn(33, 96, generator=generator)
    residual = torch.randn(33, 200, generator=generator)
    packed = cpu_gemm.pack(weight)
    alone = torch.cat([cpu_gemm.blocked_linear(x[i:i + 1], packed, 200, None, residual[i:i + 1]) for i in range(33)])
    for rows in (2, 3, 6, 7, 12, 13, 33):
        assert torch.equal(cpu_gemm.blocked_linear(x[:rows], packed, 200, None, residual[:rows]), alone[:rows]), rows


def test_no_rows_and_strided_inputs():
    weight = torch.randn(24, 8)
    packed = cpu_gemm.pack(weight)
    assert cpu_gemm.blocked_linear(torch.empty(0, 8), packed, 24).shape == (0, 24)
    wide = torch.randn(3, 16)
    torch.testing.assert_close(cpu_gemm.blocked_linear(wide[:, ::2], packed, 24), wide[:, ::2] @ weight.t())


def test_the_op_checks_its_operands():
    packed = cpu_gemm.pack(torch.randn(24, 8))
    with pytest.raises(RuntimeError, match="x must be a contiguous float32"):
        torch.ops.eyas_cpu.blocked_linear(torch.randn(2, 8, dtype=torch.float64), packed, 24)
    with pytest.raises(RuntimeError, match="w must be a contiguous float32"):
        torch.ops.eyas_cpu.blocked_linear(torch.randn(2, 9), packed, 24)
    with pytest.raises(RuntimeError, match="w must be"):
        torch.ops.eyas_cpu.blocked_linear(torch.randn(2, 8), packed, 40)  # more columns than the blocks hold
    with pytest.raises(RuntimeError, match="residual must be"):
        torch.ops.eyas_cpu.blocked_linear(torch.randn(2, 8), packed, 24, None, torch.randn(3, 24))


@pytest.mark.slow  # inductor's first compile in a process: about 20 s cold
def test_a_compiled_graph_calls_the_op():
    weight, x = torch.randn(40, 24), torch.randn(5, 24)
    packed = cpu_gemm.pack(weight)
    compiled = torch.compile(lambda x, w: torch.relu(cpu_gemm.blocked_linear(x, w, 40)) * 2, fullgraph=True)
    assert torch.equal(compiled(x, packed), torch.relu(cpu_gemm.blocked_linear(x, packed, 40)) * 2)
