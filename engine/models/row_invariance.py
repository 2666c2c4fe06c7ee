"""Row invariance: a GEMM computes each row of its input bit for bit as it computes that row alone.

Exact rows: inside `exact_rows()` (the forwards of requests that ask for logprobs) every projection
computes each row as it would alone, whatever the other rows of the call, so a verify's positions are
computed bit for bit as one-token decodes of them. A kernel found row-invariant here (`is_row_invariant`:
oneDNN's over its reordered weight, the blocked GEMM; the compressed formats by construction) runs as usual;
a dense GEMM (MKL's, which blocks its sums differently by row count) runs one row per call (`FusedLinear`).
"""

import contextlib
import contextvars

import torch

_EXACT_ROWS = contextvars.ContextVar("exact_rows", default=False)


@contextlib.contextmanager
def exact_rows(enabled: bool = True):
    """Projections compute each row as they would alone while this is entered (see the module docstring)."""
    token = _EXACT_ROWS.set(enabled)
    try:
        yield
    finally:
        _EXACT_ROWS.reset(token)


def exact_rows_requested() -> bool:
    """Whether the forward running now is inside `exact_rows()`."""
    return _EXACT_ROWS.get()


# rows a row-invariance check compares: a tail of every width a blocked kernel may split rows into
_CHECKED_ROWS = (2, 3, 5, 8, 9, 17, 33)
_ROW_INVARIANT: dict[tuple, bool] = {}  # (kernel type, in_features, out_features, dtype) -> measured


def is_row_invariant(kernel, in_features: int, dtype: torch.dtype) -> bool:
    """Whether `kernel` computes each row of x bit for bit as it does x's row alone, checked on random
    rows once per shape and process (a property of the kernel's blocking on this CPU, not of the weight)."""
    key = (type(kernel), in_features, kernel.out_features, dtype)
    if key not in _ROW_INVARIANT:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(max(_CHECKED_ROWS), in_features, generator=generator).to(dtype)
        with torch.inference_mode():
            alone = torch.cat([kernel(x[i:i + 1]) for i in range(x.shape[0])])
            _ROW_INVARIANT[key] = all(torch.equal(kernel(x[:m]), alone[:m]) for m in _CHECKED_ROWS)
    return _ROW_INVARIANT[key]
