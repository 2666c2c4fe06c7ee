"""GraphSettings: how forwards run as graphs, from the `graphs` config group.

`mode`: `eager` (no graphs), `compile` (inductor-compiled forwards, traced by Dynamo in each process),
`aot` (AOTInductor packages compiled once and loaded from `cache_dir` by later runs: `exported.py`),
`auto` (on CPU: `aot` packages compiled in the background while the engine runs eager, and swapped in
once they are on disk, `background.py`; eager on other devices, where graph capture is not built yet).
`batch_sizes`: batches up to the largest run as graphs, larger ones eager. A compiled forward takes any
batch size and context (its sizes are symbolic), so nothing is padded; `max_context` bounds the
context a graph reads (a longer sequence runs eager). `warmup` (read by the containers): compile every
graph the config can run when the engine starts, instead of on first use. `cache_dir`: inductor's
on-disk cache, so a second start does not compile again.
"""

from dataclasses import dataclass

from eyas.engine.errors import ConfigError

MODES = ("auto", "aot", "compile", "eager")


@dataclass(frozen=True)
class GraphSettings:
    mode: str  # as resolved for the device: compile or eager
    batch_sizes: tuple[int, ...]  # sorted
    max_context: tuple[int, ...]  # sorted
    cache_dir: str | None
    # auto on CPU: the engine starts eager; its runners load packages a background process compiles, and
    # never compile in the engine's own process
    background: bool = False

    @property
    def enabled(self) -> bool:
        return self.mode != "eager"

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]


def _check_positive(name: str, values) -> None:
    message = f"graphs.{name} must be a non-empty list of integers >= 1, got {values!r}"
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(message)
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        raise ConfigError(message)


def validate_graphs(graphs: dict) -> None:
    """Raises ConfigError naming the first `graphs.*` field that is not allowed."""
    mode = graphs["mode"]
    if mode not in MODES:
        raise ConfigError(f"graphs.mode must be one of {list(MODES)}, got {mode!r}")
    if not isinstance(graphs.get("warmup", True), bool):
        raise ConfigError(f"graphs.warmup must be true or false, got {graphs['warmup']!r}")
    cache_dir = graphs["cache_dir"]
    if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir):
        raise ConfigError(f"graphs.cache_dir must be a directory path or null, got {cache_dir!r}")
    _check_positive("batch_sizes", graphs["batch_sizes"])
    _check_positive("max_context", graphs["max_context"])


def graph_settings(mode: str, batch_sizes, max_context, cache_dir: str | None, device_type: str) -> GraphSettings:
    """Settings of a checked `graphs` group for a device of `device_type`, `auto` resolved."""
    background = mode == "auto" and device_type == "cpu"
    if mode == "auto":
        mode = "aot" if device_type == "cpu" else "eager"
    return GraphSettings(str(mode), tuple(sorted(set(batch_sizes))), tuple(sorted(set(max_context))), cache_dir,
                         background)
