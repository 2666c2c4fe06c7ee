"""The target every benchmark script runs unless its overrides name one (`model=smollm2`,
`model.path=...`): the tiny pair shipped inside the package, which the README's tables of the tiny
pair measured; `model=smollm2` runs the package's default model."""

from eyas.launch.compose import with_group

BENCH_MODEL = "tiny"


def bench_overrides(overrides) -> list[str]:
    """`overrides` on the bench model, eager unless they name a graphs mode: the default (auto) would compile
    in a background process and swap graphs in partway through a measurement."""
    overrides = with_group(overrides, "model", BENCH_MODEL)
    return overrides if any(o.startswith("graphs.mode=") for o in overrides) else [*overrides, "graphs.mode=eager"]


def build_engine(overrides=()):
    from eyas import build_engine as build_engine_of
    return build_engine_of(bench_overrides(overrides))


def compose_config(overrides=()) -> dict:
    from eyas.launch.compose import compose_config as compose_config_of
    return compose_config_of(bench_overrides(overrides))
