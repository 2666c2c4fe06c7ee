"""Runs return their objective to sweepers, Optuna finds and prints the best configuration, failed jobs
are recorded without losing the others, prompts files work alone from the command line, and
`python -m eyas.engine.report` tabulates and charts a sweep."""

import json
from pathlib import Path

import pytest
import yaml
from support import compose_config, run_cli
from support.engines import PLAIN

from eyas import ConfigError
from eyas.engine.config import prepare
from eyas.engine.report import collect_runs, swept_keys, write_report
from eyas.launch.best_overrides import best_overrides_line

TINY = "sampling.max_new_tokens=3"


def outputs(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.rglob("outputs.json"))]


def test_prompts_file_alone_replaces_the_default_prompt(gqa_checkpoint, tmp_path):
    (tmp_path / "prompts.txt").write_text("def add(a, b):\nimport os\n")
    proc = run_cli(*PLAIN, f"model.path={gqa_checkpoint}", "prompts_file=prompts.txt", TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [result] = outputs(tmp_path / "outputs")
    assert [o["prompt"] for o in result["outputs"]] == ["def add(a, b):", "import os"]
    assert result["config"]["prompt"] is None


@pytest.mark.parametrize("args,message", [  # a process each: the default run starts one
    (["prompt=null"], "nothing to generate: set `prompt=...` or `prompts_file=...`"),
    pytest.param(["prompt=hi", "prompts_file=p.txt"], "set at most one of `prompt` and `prompts_file`",
                 marks=pytest.mark.slow),
    pytest.param(["objective=speed"], "objective 'speed' is not a metric a run returns; allowed: \\['tokens_per_s'",
                 marks=pytest.mark.slow),
])
def test_prompt_and_objective_mistakes_exit_with_the_field_named(gqa_checkpoint, tmp_path, args, message):
    import re

    proc = run_cli(*PLAIN, f"model.path={gqa_checkpoint}", *args, TINY, cwd=tmp_path)
    assert proc.returncode == 2 and re.search(message, " ".join(proc.stderr.split())), proc.stderr


def test_prompt_null_with_a_prompts_file(gqa_checkpoint, tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "class A:"}\n')
    config = compose_config([*PLAIN, f"model.path={gqa_checkpoint}", "prompt=null", f"prompts_file={tmp_path / 'p.jsonl'}"])
    assert config["prompt"] is None and config["prompts_file"].endswith("p.jsonl")
    assert compose_config(PLAIN)["prompt"] == "def fibonacci(n):"


def test_speculative_objectives_need_speculation():
    with pytest.raises(ConfigError, match="objective 'mean_accept_length' needs speculative decoding"):
        prepare(compose_config([*PLAIN, "objective=mean_accept_length"]))
    assert prepare(compose_config(["objective=mean_accept_length"]))[0]["objective"] == "mean_accept_length"


def test_the_draft_head_follows_the_algorithm():
    assert compose_config(["speculative=eagle"])["draft"]["kind"] == "eagle"
    assert compose_config(["speculative=none"])["draft"]["kind"] == "none"
    with pytest.raises(ConfigError, match="set draft=eagle"):
        prepare(compose_config(["speculative=eagle", "draft=eagle3"]))


@pytest.mark.parametrize("objective,metric", [("tokens_per_s", "tokens_per_s"), pytest.param(
    "mean_accept_length", "mean_accept_length", marks=pytest.mark.slow)])
def test_optuna_search_maximises_the_objective_and_prints_the_best_overrides(tmp_path, objective, metric):
    proc = run_cli("-m", "experiment=tune_speculative", "hydra.sweeper.n_trials=3", f"objective={objective}",
                   "hydra.sweep.dir=sweep", TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    runs = outputs(tmp_path / "sweep")
    assert len(runs) == 3 and all(r["objective"] == r["metrics"][metric] for r in runs)
    best = max(runs, key=lambda r: r["objective"])
    assert results["best_value"] == pytest.approx(best["objective"])
    params = results["best_params"]
    assert set(params) == {"speculative", "adaptive", "speculative.num_steps"}
    assert params["speculative.num_steps"] == best["config"]["speculative"]["num_steps"]
    line = f"python -m eyas objective={objective} {TINY} model=tiny speculative={params['speculative']} " \
           f"adaptive={params['adaptive']} speculative.num_steps={params['speculative.num_steps']}"
    assert line in proc.stdout, proc.stdout[-2000:]


def test_best_overrides_line_keeps_the_fixed_overrides_first():
    results = {"best_params": {"speculative": "eagle3", "speculative.num_steps": 4}, "best_value": 1.0}
    assert best_overrides_line(results, ["model.path=/m"]) == \
        "python -m eyas model.path=/m speculative=eagle3 speculative.num_steps=4"


def test_a_failing_job_is_recorded_and_the_others_run(gqa_checkpoint, tmp_path):
    proc = run_cli("-m", *PLAIN, f"model.path={gqa_checkpoint}", "cache.max_total_tokens=4,2048", "hydra.sweep.dir=sweep",
                   TINY, cwd=tmp_path)
    assert proc.returncode != 0 and "cache.max_total_tokens (4) must be at least cache.page_size" in proc.stderr
    failed, ran = (json.loads((tmp_path / "sweep" / str(i) / "outputs.json").read_text()) for i in (0, 1))
    assert "cache.max_total_tokens (4)" in failed["error"] and "cache.max_total_tokens=4" in failed["overrides"]
    assert ran["metrics"]["generated_tokens"] == 3
    report = run_cli(str(tmp_path / "sweep"), cwd=tmp_path, module="eyas.engine.report")
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "sweep" / "report.md").read_text()
    assert "| 0 | 4 | - | - | - | cache.max_total_tokens (4) must be at least" in text


def fake_run(root: Path, job: str, overrides: list[str], metrics: dict | None = None, error: str | None = None):
    directory = root / job
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    data = {"metrics": metrics} if metrics is not None else {"overrides": overrides, "error": error}
    (directory / "outputs.json").write_text(json.dumps(data))


def metrics(tps, tau=None, acceptance=(), failed=0):
    out = {"tokens_per_s": tps, "num_failed": failed, "num_requests": 4}
    if tau is not None:
        out.update(mean_accept_length=tau, accept_rate_per_position=list(acceptance))
    return out


def test_report_tables_and_charts_a_sweep(tmp_path):
    root = tmp_path / "multirun"
    for job, steps, kind, tps in [(0, 1, "eagle", 100.0), (1, 10, "eagle", 90.0), (2, 2, "eagle", 150.0),
                                  (10, 1, "eagle3", 120.0), (11, 2, "eagle3", 160.0)]:
        fake_run(root, str(job), [f"speculative={kind}", f"speculative.num_steps={steps}", "seed=1"],
                 metrics(tps, 1.0 + steps / 10, [0.9, 0.5][:steps]))
    fake_run(root, "12", ["speculative=eagle3", "speculative.num_steps=99", "seed=1"], error="boom | bad")
    fake_run(root, "3", ["speculative=none", "speculative.num_steps=0", "seed=1"], metrics(80.0, failed=1))
    runs = collect_runs(root)
    assert [str(r.directory) for r in runs] == ["0", "1", "2", "3", "10", "11", "12"]  # numbered jobs in order
    assert swept_keys(runs) == ["speculative", "speculative.num_steps"]
    path = write_report(root)
    text = path.read_text()
    assert "7 run(s); swept: speculative, speculative.num_steps" in text
    assert "| 11 | eagle3 | 2 | 160.00 | 1.20 | 0.90 0.50 | - |" in text
    assert "| 3 | none | 0 | 80.00 | - | - | 1 of 4 requests failed |" in text
    assert "| 12 | eagle3 | 99 | - | - | - | boom \\| bad |" in text
    charts = sorted(p.name for p in root.glob("*.png"))
    assert charts == ["acceptance_by_position.png", "by_speculative.png", "by_speculative_num_steps.png"]
    assert all((root / c).stat().st_size > 5000 for c in charts) and all(f"]({c})" in text for c in charts)


def test_report_of_an_optuna_sweep_names_the_best_trial(tmp_path):
    fake_run(tmp_path, "0", ["speculative.num_steps=3"], metrics(100.0, 2.5, [0.9, 0.7, 0.5]))
    (tmp_path / "optimization_results.yaml").write_text(yaml.safe_dump(
        {"name": "optuna", "best_params": {"speculative.num_steps": 3}, "best_value": 100.0}))
    text = write_report(tmp_path, charts=False).read_text()
    assert "objective 100.00 with `speculative.num_steps=3`" in text and not list(tmp_path.glob("*.png"))


def test_report_errors_name_the_directory(tmp_path):
    proc = run_cli(str(tmp_path / "nope"), cwd=tmp_path, module="eyas.engine.report")
    assert proc.returncode == 2 and "no such directory" in proc.stderr
    proc = run_cli(str(tmp_path), cwd=tmp_path, module="eyas.engine.report")
    assert proc.returncode == 2 and f"no outputs.json and no benchmark record under {tmp_path}" in proc.stderr
