"""The Hydra command line: a run prints and writes its outputs; a multirun sweep runs end to end."""

import json
import os

import pytest
from rich.console import Console
from support import compose_config, run_cli
from support.engines import PLAIN

from eyas import ConfigError
from eyas.launch.cli import quote_free_text, run


def test_run_prints_completion_and_summary_and_writes_json(gqa_checkpoint, tmp_path):
    config = compose_config([*PLAIN, f"model.path={gqa_checkpoint}", "prompt='def add(a, b):'", "sampling.max_new_tokens=8",
                             "sampling.ignore_eos=true"])
    console = Console(record=True, width=200)
    result = run(config, tmp_path, console)
    printed = console.export_text()
    assert "def add(a, b):" in printed and "generated 8 tokens" in printed and "tok/s" in printed
    saved = json.loads((tmp_path / "outputs.json").read_text())
    assert saved["outputs"][0]["token_ids"] == result["outputs"][0]["token_ids"]
    assert len(saved["outputs"][0]["token_ids"]) == 8 and saved["metrics"]["generated_tokens"] == 8


def test_prompts_file_plain_and_jsonl(gqa_checkpoint, tmp_path):
    plain = tmp_path / "prompts.txt"
    plain.write_text("import os\n\nclass A:\n")
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(json.dumps({"prompt": "def f():\n    return"}) + "\n")
    for path, n in ((plain, 2), (jsonl, 1)):
        config = compose_config([*PLAIN, f"model.path={gqa_checkpoint}", f"prompts_file={path}", "prompt=null",
                                 "sampling.max_new_tokens=3"])
        assert len(run(config, None, Console(file=open(os.devnull, "w")))["outputs"]) == n
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    config = compose_config([*PLAIN, f"model.path={gqa_checkpoint}", f"prompts_file={bad}", "prompt=null"])
    with pytest.raises(ConfigError, match="'prompt' field"):
        run(config, None)


@pytest.mark.parametrize("text", ["def fib(n):", "a, b = 'x', \\'y\\'", "x = [1, 2]  # {dict}", "ends with \\"])
def test_prompt_is_free_text_on_the_command_line(text):
    args = quote_free_text([f"prompt={text}", "sampling.top_p=0.5"])
    assert args[1] == "sampling.top_p=0.5"
    config = compose_config(["model.path=/x", *args])
    assert config["prompt"] == text


def test_cli_bad_value_exits_with_message(tmp_path):
    proc = run_cli("cache.page_size=0", "model.path=/x", cwd=tmp_path)
    assert proc.returncode != 0 and "cache.page_size" in proc.stderr + proc.stdout


def test_multirun_sweep_end_to_end(gqa_checkpoint, tmp_path):
    proc = run_cli("-m", *PLAIN, f"model.path={gqa_checkpoint}", "prompt=def fib(n):", "sampling.max_new_tokens=2,3", "cache=default,small",
                   "sampling.ignore_eos=true", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = sorted((tmp_path / "sweep").glob("*/outputs.json"))
    assert len(runs) == 4
    lengths = sorted(len(json.loads(p.read_text())["outputs"][0]["token_ids"]) for p in runs)
    assert lengths == [2, 2, 3, 3]


def test_adaptive_sweep_end_to_end(tmp_path):
    """`-m adaptive=off,ema,throughput` on the shipped pair; the adaptive runs report their step counts."""
    proc = run_cli("-m", "adaptive=off,ema,throughput", "prompt=def fib(n):", "sampling.max_new_tokens=24",
                   "sampling.ignore_eos=true", "speculative.num_steps=2", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("is not a candidate of the first tier") == 1  # ema (1, 3, 5, 7) starts at 5; throughput has 2
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/outputs.json"))]
    assert [r["config"]["adaptive"]["policy"] for r in runs] == ["off", "ema", "throughput"]
    assert "adaptive_switches" not in runs[0]["metrics"]
    assert all(sum(r["metrics"]["adaptive_cycles_at_steps"].values()) > 0 for r in runs[1:])
    assert len({tuple(r["outputs"][0]["token_ids"]) for r in runs}) == 1  # greedy: the same tokens


def test_local_settings_apply_before_command_line_overrides(gqa_checkpoint, tmp_path):
    """`local/default.yaml` of a config directory given with `-cd` (the source checkout's `conf/local/`
    works the same way) sets top-level keys; the command line still wins."""
    (tmp_path / "mine" / "local").mkdir(parents=True)
    (tmp_path / "mine" / "local" / "default.yaml").write_text(
        f"model:\n  path: {gqa_checkpoint}\nsampling:\n  max_new_tokens: 3\n  ignore_eos: true\n")
    for extra, n in (((), 3), (("sampling.max_new_tokens=5",), 5)):
        proc = run_cli("-cd", str(tmp_path / "mine"), *PLAIN, "prompt=def fib(n):", *extra,
                       f"hydra.run.dir={tmp_path}/run{n}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        saved = json.loads((tmp_path / f"run{n}" / "outputs.json").read_text())
        assert saved["config"]["model"]["path"] == str(gqa_checkpoint)
        assert len(saved["outputs"][0]["token_ids"]) == n


def test_logit_bias_logprobs_and_n_on_the_command_line(gqa_checkpoint, tmp_path):
    """A dict, a count and samples per prompt as a user types them; outputs.json holds every sample
    with its logprobs, and a bad penalty is refused naming the field."""
    proc = run_cli(*PLAIN, f"model.path={gqa_checkpoint}", "prompt='def add(a, b):'", "sampling.max_new_tokens=6",
                   "sampling.ignore_eos=true", "sampling.logit_bias={5:-100,9:4.5}", "sampling.logprobs=2",
                   "sampling.n=2", "sampling.temperature=0.8", "sampling.seed=3", "sampling.presence_penalty=0.5",
                   f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    outputs = json.loads((tmp_path / "outputs.json").read_text())["outputs"]
    assert [o["index"] for o in outputs] == [0, 1] and outputs[0]["token_ids"] != outputs[1]["token_ids"]
    for out in outputs:
        assert [e["token_id"] for e in out["logprobs"]] == out["token_ids"] and 5 not in out["token_ids"]
        assert all(len(e["top"]) == 2 and e["logprob"] <= 0 for e in out["logprobs"])
    bad = run_cli(*PLAIN, f"model.path={gqa_checkpoint}", "sampling.frequency_penalty=-3", cwd=tmp_path)
    assert bad.returncode != 0 and "sampling.frequency_penalty must be in [-2.0, 2.0]" in bad.stderr + bad.stdout
