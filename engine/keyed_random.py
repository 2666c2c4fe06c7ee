"""Counter-based random numbers: the noise of a request's token at output position i is a pure function
of (seed, i, token id), so any code path that needs it (plain decoding, verification at any depth, a
drafter) gets the same numbers without sharing a generator's state.

The hash is 32-bit integer mixing (two rounds of a multiply-xorshift bijection) done in int64 tensor
lanes, so it runs vectorised on any device and gives the same bits on CPU and GPU. Products are kept
below 2**63 (see `_mul32`), so no step relies on signed overflow.
"""

import torch

from eyas.kernels import cpu_ops

MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B  # multiplier pair of a low-bias 32-bit mixer
_SEED_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # 64-bit finaliser (host side)
MAX_SEED = 2**64 - 1


def seed_words(seed: int) -> tuple[int, int]:
    """A seed in [0, 2**64) -> two well-mixed 32-bit key words (computed once per request, on the host)."""
    z = (seed + _SEED_MIX[0]) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * _SEED_MIX[1]) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * _SEED_MIX[2]) & (2**64 - 1)
    z ^= z >> 31
    return z & MASK32, z >> 32


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 without int64 overflow: for c >= 2**31,
    x * c = x * (c - 2**31) + x * 2**31, and x * 2**31 mod 2**32 only keeps x's lowest bit."""
    if c < 2**31:
        return (x * c) & MASK32
    return (x * (c - 2**31) + ((x & 1) << 31)) & MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of [0, 2**32) with full avalanche (each input bit flips each output bit about half the time)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def _mul32_(x: torch.Tensor, c: int) -> torch.Tensor:
    """`_mul32` in place on `x` (a tensor the caller owns)."""
    if c < 2**31:
        return x.mul_(c).bitwise_and_(MASK32)
    low = (x & 1).bitwise_left_shift_(31)
    return x.mul_(c - 2**31).add_(low).bitwise_and_(MASK32)


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """`_mix32` in place on `x` (a tensor the caller owns): per-token noise hashes [R, vocab] lanes each step,
    and a new tensor per operation cost a third more time there."""
    x.bitwise_xor_(x >> 16)
    _mul32_(x, _M1)
    x.bitwise_xor_(x >> 15)
    _mul32_(x, _M2)
    return x.bitwise_xor_(x >> 16)


def row_keys(words: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """words: [R, 2] seed words; positions: [R] output positions -> [R, 2] per-row keys (int64, 32-bit values)."""
    a = _mix32(words[:, 0] ^ _mix32(positions & MASK32))
    b = _mix32((words[:, 1] + a) & MASK32)
    return torch.stack([a, b], dim=1)


def uniforms(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """keys: [R, 2]; token_ids: [n] or [R, n] -> [R, n] float32 uniforms in (0, 1), one per (row, token).
    On a CPU with eyas's ops built, in one pass (`kernels/cpu_keyed_noise.cpp`, the same bits)."""
    if keys.device.type == "cpu" and cpu_ops.is_loaded():
        return torch.ops.eyas_cpu.keyed_uniforms(keys, token_ids)
    return tensor_uniforms(keys, token_ids)


def tensor_uniforms(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """`uniforms` in tensor ops, on any device."""
    x = _mix32_(token_ids ^ keys[:, :1])  # a new tensor, [R, n]: hashed in place
    return to_uniforms(_mix32_(x.bitwise_xor_(keys[:, 1:])))


def to_uniforms(bits: torch.Tensor) -> torch.Tensor:
    """32-bit hash values (int64) -> float32 uniforms in (0, 1): the top 24 bits, centred. The top value,
    2**24 - 0.5, rounds to 2**24 in float32: it is clamped below 1 (E = -log u > 0, an exponential race
    never divides by zero)."""
    return (((bits >> 8).float() + 0.5) * (1.0 / 2**24)).clamp_(max=1.0 - 2**-24)


# The same hash on host integers, for the few values a step's keys and streams need (tens of positions):
# a tensor op costs microseconds whatever its size, a Python integer op tens of nanoseconds. Bit for bit
# the tensor functions' values.

def _mix32_host(x: int) -> int:
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 15
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def row_keys_host(word: tuple[int, int], position: int) -> tuple[int, int]:
    """`row_keys` of one row."""
    a = _mix32_host(word[0] ^ _mix32_host(position & MASK32))
    return a, _mix32_host((word[1] + a) & MASK32)


def hash_host(key: tuple[int, int], token_id: int) -> int:
    """The 32-bit value `uniforms` maps to (0, 1) for one (key, token id)."""
    return _mix32_host(_mix32_host(token_id ^ key[0]) ^ key[1])


def exponentials(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Standard exponential noise [R, n]: argmax_t p_t / E_t draws t with probability p_t (the
    exponential race, equivalent to Gumbel-max: argmax log p_t - log E_t)."""
    return -torch.log(uniforms(keys, token_ids))


# Named streams: ids past any vocabulary, so a stream's numbers are independent of every token's noise
# at the same (seed, position) and of each other's. Rejection-sampling verification draws its drafts,
# accept tests and residual samples from them.
DRAFT_STREAM, ACCEPT_STREAM, RESIDUAL_STREAM = 0xFFFFFFF0, 0xFFFFFFF1, 0xFFFFFFF2
