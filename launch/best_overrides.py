"""A Hydra callback that prints an Optuna sweep's best configuration as overrides ready to paste."""

from pathlib import Path

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def best_overrides_line(results: dict, fixed: list[str]) -> str:
    """`optimization_results.yaml` contents -> `python -m eyas k=v ...` (the sweep's fixed overrides
    first, then the best trial's parameters)."""
    params = [f"{key}={value}" for key, value in results["best_params"].items()]
    return " ".join(["python -m eyas", *fixed, *params])


class PrintBestOverrides(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        path = Path(config.hydra.sweep.dir) / "optimization_results.yaml"
        if not path.is_file():
            return
        results = yaml.safe_load(path.read_text())
        swept = set(results["best_params"])
        keys = {o: o.split("=", 1)[0].lstrip("+~") for o in config.hydra.overrides.task}
        # what the sweep held fixed (your model, prompts, sampling), less the search itself
        fixed = [o for o, key in keys.items() if key not in swept and key != "experiment" and not key.startswith("hydra")]
        print(f"best {config.get('objective', 'objective')}: {results['best_value']:.4g}  ({path})")
        print(best_overrides_line(results, fixed))
