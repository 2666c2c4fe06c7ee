"""The Hydra command line: `python -m eyas key=value ...` (and `-m` for sweeps).

`hydra_main` is a thin shell around `run`, which tests call with a composed plain config.
"""

import json
import re
import sys
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console

from eyas.containers.build import container_of
from eyas.engine.chat_template import ChatTemplateError
from eyas.engine.config import prepare
from eyas.engine.errors import ConfigError, EyasError
from eyas.engine.sampling_params import SamplingParams
from eyas.launch.compose import config_dir, register_resolvers, to_plain
from eyas.launch.schema import register_schemas


def read_prompts(config: dict) -> list[str]:
    if config.get("prompts_file"):
        path = Path(config["prompts_file"]).expanduser()
        if not path.is_file():
            raise ConfigError(f"prompts_file: no such file: {path}")
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        if path.suffix == ".jsonl":
            try:
                return [json.loads(line)["prompt"] for line in lines]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"prompts_file {path}: each line must be a JSON object with a 'prompt' field ({e})")
        return lines
    if config.get("prompt") is None:
        raise ConfigError("nothing to generate: set `prompt=...` or `prompts_file=...`")
    return [config["prompt"]]


def summary_line(metrics: dict) -> str:
    parts = [
        f"requests {metrics['num_requests']}",
        f"generated {metrics['generated_tokens']} tokens",
        f"{metrics['tokens_per_s']:.1f} tok/s",
        f"forward steps {metrics['forward_steps']}",
    ]
    if "mean_accept_length" in metrics:
        parts.append(f"tau {metrics['mean_accept_length']:.2f}")
    if "adaptive_cycles_at_steps" in metrics:
        at = ", ".join(f"{k}:{n}" for k, n in metrics["adaptive_cycles_at_steps"].items())
        parts.append(f"steps {{{at}}} switches {metrics['adaptive_switches']}")
    if "graphs_state" in metrics:  # graphs.mode=auto
        parts.append(f"graphs {metrics['graphs_state']}")
    if metrics["num_failed"]:
        parts.append(f"failed {metrics['num_failed']}")
    return " | ".join(parts)


def as_chat(prompts: list[str], chat: bool | None, template, model_path: str) -> list[str]:
    """Each prompt as a user message in the checkpoint's chat template (`chat`: null = when it has one)."""
    if chat is False or (chat is None and template is None):
        return prompts
    if template is None:
        raise ConfigError(f"chat=true: the checkpoint at model.path={model_path} has no chat template "
                          f"(chat_template in tokenizer_config.json); set chat=false or null")
    try:
        return [template.render([("user", p)]) for p in prompts]
    except ChatTemplateError as e:
        raise ConfigError(f"chat: {e}; set chat=false to send the prompt as it is") from e


def run(config: dict, output_dir: str | Path | None = None, console: Console | None = None) -> dict:
    """Generate for the configured prompts (of a composed config, resolved here); print its notices,
    the completions and a summary; write outputs.json (with the resolved config)."""
    console = console or Console()
    config, notices = prepare(config)
    prompts = read_prompts(config)
    container = container_of(config)
    for notice in notices:
        console.print(notice, markup=False, highlight=False, soft_wrap=True)
    prompts = as_chat(prompts, config.get("chat"), container.models.chat_template(), config["model"]["path"])
    with container.engine() as engine:
        outputs = engine.generate(prompts, SamplingParams(**config["sampling"]))
        metrics = engine.metrics()
    if config.get("print_outputs", True):
        for out in outputs:
            sample = f", sample {out.index}" if out.index else ""
            console.rule(f"request {out.request_id} ({out.finish_reason}{sample})")
            if out.error:
                console.print(f"[red]error:[/red] {out.error}", markup=True, highlight=False)
            else:
                console.print(out.prompt, end="", markup=False, highlight=False, style="dim")
                console.print(out.text, markup=False, highlight=False)
    console.print(summary_line(metrics), markup=False, highlight=False, soft_wrap=True)
    objective = metrics[config.get("objective", "tokens_per_s")]
    result = {"config": config, "metrics": metrics, "objective": objective, "outputs": [asdict(o) for o in outputs]}
    if output_dir is not None:
        path = Path(output_dir) / "outputs.json"
        path.write_text(json.dumps(result, indent=2, default=str))
        console.print(f"outputs written to {path}", markup=False, highlight=False)
    return result


register_schemas()
register_resolvers()


@hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> float:
    """One run; returns its objective metric, which a sweeper (hydra/sweeper=optuna) optimises. In a
    multirun a run that fails writes its error to outputs.json (the report lists it) and raises: the
    launcher records the failed job, the other jobs of its batch still run, and the sweeper decides
    what follows (the basic sweeper stops after the batch; Optuna marks the trial failed and stops
    beyond `hydra.sweeper.max_failure_rate`)."""
    hydra_config = HydraConfig.get()
    try:
        result = run(to_plain(cfg), hydra_config.runtime.output_dir)
    except EyasError as e:
        Console(stderr=True).print(f"error: {e}", markup=False, highlight=False)
        if hydra_config.mode != RunMode.MULTIRUN:
            sys.exit(2)
        failure = {"overrides": list(hydra_config.overrides.task), "error": str(e)}
        (Path(hydra_config.runtime.output_dir) / "outputs.json").write_text(json.dumps(failure, indent=2))
        raise
    return result["objective"]


FREE_TEXT_KEYS = ("prompt", "+prompt", "++prompt")


def quote_free_text(argv: list[str]) -> list[str]:
    """`prompt=def fib(n):` is free text, not Hydra grammar: quote it unless the user already did
    (`prompt=null` stays null: no prompt)."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
        if sep and key in FREE_TEXT_KEYS and not quoted and value != "null":  # prompt=null: no prompt
            escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
            arg = f"{key}='{escaped}'"
        out.append(arg)
    return out


def main() -> None:
    sys.argv[1:] = quote_free_text(sys.argv[1:])
    hydra_main()
