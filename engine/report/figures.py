"""matplotlib without a display, for reports and the benchmark scripts (the `[sweep]` / `[bench]` extras)."""

from pathlib import Path

from eyas.engine.errors import ConfigError


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), or a ConfigError saying how to install it."""
    try:
        import matplotlib
    except ImportError as e:
        raise ConfigError("charts need matplotlib: pip install 'eyas[sweep]' (or '.[sweep]' in a checkout)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> Path:
    """Lay `fig` out within `rect` (figure fractions: room for a legend outside it), write it as a PNG at
    `path` and close it (a report draws many)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def as_numbers(values: list[str]) -> list[float] | None:
    """The values as numbers when every one is numeric, else None (categorical)."""
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        return None
