"""eyas's one-pass keyed uniforms (`kernels/cpu_keyed_noise.cpp`): the tensor ops' bits for any keys and
token ids (the stream ids past every vocabulary, the largest 32-bit values, one row or many, [n] or [R, n]
ids), so a sampled token is the same with the ops built or not."""

import pytest
import torch

from eyas.engine import keyed_random
from eyas.engine.cpu_ops import cpu_ops_error

if cpu_ops_error() is not None:
    pytest.skip(f"eyas's CPU kernels cannot be built here: {cpu_ops_error()}", allow_module_level=True)


@pytest.mark.parametrize("rows,columns,per_row", [(8, 49152, False), (3, 4096, True), (1, 7, False), (33, 5000, False),
                                                  (2, 20000, True)])
def test_op_gives_the_tensor_ops_bits(rows, columns, per_row):
    generator = torch.Generator().manual_seed(rows * columns)
    keys = torch.randint(0, 2**32, (rows, 2), generator=generator, dtype=torch.int64)
    ids = torch.randint(0, 2**32, (rows, columns) if per_row else (columns,), generator=generator, dtype=torch.int64)
    got = keyed_random.uniforms(keys, ids)
    assert got.dtype == torch.float32 and got.shape == (rows, columns)
    assert torch.equal(got, keyed_random.tensor_uniforms(keys, ids))


def test_op_at_the_edges_of_the_hash():
    keys = torch.tensor([[0, 0], [2**32 - 1, 12345], [0x9E3779B9, 2**31]], dtype=torch.int64)
    streams = [keyed_random.DRAFT_STREAM, keyed_random.ACCEPT_STREAM, keyed_random.RESIDUAL_STREAM, 2**32 - 1]
    ids = torch.cat([torch.arange(2**20), torch.tensor(streams)])
    got = keyed_random.uniforms(keys, ids)
    assert torch.equal(got, keyed_random.tensor_uniforms(keys, ids))
    assert bool((got > 0).all()) and bool((got < 1).all())
