"""`python -m eyas.bench` and the check scripts run end to end as users run them (tiny settings; figures are
not checked), and every subcommand writes the one record format the report reads."""

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_script(name: str, *args: str) -> str:
    return run([sys.executable, str(SCRIPTS / name), *args])


def run_bench(name: str, *args: str) -> str:
    return run([sys.executable, "-m", "eyas.bench", name, *args])


def read_record(out: Path, name: str) -> dict:
    """The subcommand's record: its command, the host, a table and the full results."""
    record = json.loads((out / f"{name}.json").read_text())
    assert record["bench"] == name and record["command"].startswith(f"python -m eyas.bench {name} ")
    assert record["host"]["cpu"] and record["host"]["cpus"] >= 1 and record["host"]["torch"]
    assert record["table"] and all(isinstance(v, (int, float, str, bool, type(None)))
                                   for row in record["table"] for v in row.values())
    return record


@pytest.mark.slow  # eyas's peer rows, every system built: about 13 s
def test_bench_peers_eyas_rows(tmp_path):
    out = run_bench("peers", "--systems", "eyas,eyas_spec,eyas_ngram,hf_lookup", "--batch-sizes", "1,2",
                     "--max-new-tokens", "6", "--num-prompts", "2", "--rounds", "1", "--out", str(tmp_path))
    assert "| 2 | eyas EAGLE-3 k=3 |" in out and "| 2 | eyas n-gram |" in out
    assert "batch 1: eyas n-gram / transformers prompt lookup = " in out  # prompt lookup runs at batch 1 only
    assert "batch 2: eyas n-gram lookup and index update " in out
    result = read_record(tmp_path, "peers")["results"]
    rows = [r for r in result["rows"] if r["tok_s"] is not None]
    assert {(r["batch"], r["system"]) for r in rows} == {
        *((b, s) for b in (1, 2) for s in ("eyas plain", "eyas EAGLE-3 k=3", "eyas n-gram")), (1, "transformers prompt lookup")}
    assert [(r["batch"], r["peer"]) for r in result["peer_ratios"]] == [(1, "transformers prompt lookup")]
    # greedy speculative output equals plain decoding, row for row
    assert all(r["equal"].startswith(("reference", "4/4 rows identical", "2/2 rows identical")) for r in rows), rows
    assert (tmp_path / "peers.png").stat().st_size > 5000


@pytest.mark.slow
def test_bench_peers_on_a_repeated_workload_reports_the_default_against_fixed_drafters(tmp_path):
    out = run_bench("peers", "--workload", "repeated", "--systems", "eyas,eyas_adaptive,eyas_suffix,eyas_k2",
                     "--eyas", "chains=adaptive.tiers=[{batch_size:1,candidates:[1,2,3]}]", "--batch-sizes", "1",
                     "--max-new-tokens", "6", "--num-prompts", "3", "--rounds", "1", "--out", str(tmp_path))
    assert "workload repeated;" in out and "| 1 | eyas suffix |" in out and "| 1 | eyas chains |" in out
    assert "batch 1: eyas adaptive (default) chose " in out  # the candidates it ran, by share of cycles
    assert "batch 1: the default / the fastest fixed configuration (" in out
    rows = read_record(tmp_path, "peers")["results"]["rows"]
    assert all(r["equal"].startswith(("reference", "3/3 rows identical")) for r in rows), rows


def test_bench_peers_systems_name_their_graphs_mode_and_auto_keeps_its_packages_where_asked():
    """The default graphs mode (auto) compiles in the background and swaps in mid-run: only the eyas_*auto
    systems run it, in the --graphs-cache directory, where the aot systems (built first) keep their packages;
    every other eyas system names its mode (eager unless it is a graphs system)."""
    from eyas.bench.peers import EYAS_OVERRIDES as ORDER

    assert list(ORDER).index("eyas_adaptive_aot") < list(ORDER).index("eyas_auto")
    from eyas.bench.peers import EYAS_OVERRIDES, graphs_of

    modes = {name: [o for o in graphs_of(overrides, "/packages") if o.startswith("graphs.")]
             for name, overrides in EYAS_OVERRIDES.items()}
    assert modes["eyas"] == modes["eyas_adaptive"] == modes["eyas_k3"] == ["graphs.mode=eager"]
    assert modes["eyas_aot"] == ["graphs.mode=aot", "graphs.cache_dir=/packages"]
    assert modes["eyas_graphs"] == ["graphs.mode=compile"]
    assert modes["eyas_auto"] == modes["eyas_adaptive_auto"] == ["graphs.mode=auto", "graphs.cache_dir=/packages"]
    assert all(len([o for o in m if o.startswith("graphs.mode=")]) == 1 for m in modes.values()), modes


@pytest.mark.slow  # a background compile of the tiny pair's default packages: minutes
def test_bench_peers_times_the_starts_a_user_gets_and_runs_the_default_as_started(tmp_path):
    out = run_bench("peers", "--starts", "--systems", "eyas,eyas_adaptive_auto", "--batch-sizes", "1",
                    "--max-new-tokens", "6", "--num-prompts", "2", "--rounds", "1", "--out", str(tmp_path))
    result = read_record(tmp_path, "peers")["results"]
    assert [(s["start"], s["graphs"]) for s in result["starts"]] == [
        ("eager", "eager"), ("first start", "compiling"), ("second start", "graphs")], result["starts"]
    assert all(s["wall_s"] > 0 and s["tok_s"] > 0 for s in result["starts"])
    assert "the background compile ended" in out and "| 1 | eyas default, as started |" in out
    rows = [r for r in result["rows"] if r["tok_s"] is not None]
    assert all(r["equal"].startswith(("reference", "2/2 rows identical")) for r in rows), rows


def test_workloads_are_distinct_prompts_and_repeated_ones_follow_their_originals():
    from eyas.bench.workloads import REPEATS, WORKLOADS, workload_prompts

    for name in WORKLOADS:
        prompts = workload_prompts(name, 9)
        assert len(prompts) == 9 and all(p.strip() for p in prompts), name
        if name != "repeated":
            assert len(set(prompts)) == 9, name
    repeated, originals = workload_prompts("repeated", 9), workload_prompts("package", 3)
    assert repeated[::REPEATS + 1] == originals  # each original, then its edited copies
    for i, original in zip(range(0, 9, REPEATS + 1), originals):
        for edited in repeated[i + 1:i + REPEATS + 1]:
            assert edited != original and (original in edited or edited.replace("_v2", "", 1) == original)
    assert all(p.rstrip().endswith(('"""', "'''")) for p in workload_prompts("docstring", 5))
    with pytest.raises(ValueError, match="unknown workload 'poems'; allowed: stdlib, package"):
        workload_prompts("poems", 1)


@pytest.mark.slow
def test_bench_quant_times_every_format_and_reports_quality(tmp_path):
    # CTranslate2 is a [bench] extra, not installed with the tests: its row is left out here
    out = run_bench("quant", "--systems", "float32,bfloat16,int8,int4,int8_ngram", "--layers", "2",
                     "--hidden-size", "128", "--intermediate-size", "256", "--heads", "4", "--kv-heads", "2",
                     "--max-new-tokens", "6", "--num-prompts", "1", "--rounds", "1", "--loss-windows", "4",
                     "--quality-prompts", "2", "--out", str(tmp_path))
    assert "| 1 | eyas int8 |" in out and "| int4 |" in out
    result = read_record(tmp_path, "quant")["results"]
    speed = {r["system"]: r for r in result["speed"]}
    assert set(speed) == {"eyas float32", "eyas bfloat16 (fp16 weights)", "eyas int8", "eyas int4 (group 128)",
                          "eyas int8, n-gram drafter"}
    assert all(r["tok_s"] > 0 and r["vs_float32"] > 0 for r in speed.values())
    assert speed["eyas int8, n-gram drafter"]["greedy_ids"].startswith("1/1 rows identical vs eyas int8")
    quality = {r["format"]: r for r in result["quality"]}
    assert list(quality) == ["float32", "bfloat16", "int8", "int4"]
    assert all(r["eagle3_equals_plain"] for r in quality.values())  # lossless against its own format
    assert quality["float32"]["loss_vs_float32"] == 0 and quality["float32"]["greedy_positions_equal_float32"] == 1
    assert abs(quality["int8"]["loss_vs_float32"]) < 0.02  # the shipped target keeps its loss in int8


@pytest.mark.slow  # every config twice: about 6 s
def test_bench_sampled_runs_every_config_in_both_verify_modes(tmp_path):
    out = run_bench("sampled", "--batch-sizes", "2", "--configs", "k=2,ngram", "--num-prompts", "2",
                     "--max-new-tokens", "6", "--out", str(tmp_path))
    result = read_record(tmp_path, "sampled")["results"]["batch 2, T=0.8"]
    assert set(result) == {"plain", "k=2 reproducible", "k=2 rejection", "ngram reproducible", "ngram rejection"}
    # the reproducible mode's seeded output is plain decoding's
    assert result["k=2 reproducible"]["same_as_plain"] and result["ngram reproducible"]["same_as_plain"]
    assert all(r["tokens_per_s"] > 0 for r in result.values()) and "k=2 rejection" in out


def test_bench_spec_reports_the_cost_of_a_sampled_position(tmp_path):
    out = run_bench("spec", "--ks", "2", "--trees", "", "--num-prompts", "2", "--max-new-tokens", "8",
                     "--temperature", "0.8", "--top-p", "0.95", "--out", str(tmp_path))
    assert "choosing tokens, per position (logits row), sampled vs greedy" in out
    result = read_record(tmp_path, "spec")["results"]
    row = result["rows"][0]
    assert row["t_choice_sampled"] > 0 and row["t_choice_greedy"] > 0 and result["plain_choice_sampled"] > 0


@pytest.mark.slow
def test_bench_spec_prints_phase_floors(tmp_path):
    out = run_bench("spec", "--ks", "2", "--trees", "3:2:5", "--num-prompts", "2", "--max-new-tokens", "8",
                     "--out", str(tmp_path), "--plot", str(tmp_path / "spec.png"))
    assert "floors (GEMMs of the phase alone" in out
    assert "one draft step (draft phase / k, chains): " in out and "host work between two cycles: 2: " in out
    assert "trees against the fastest chain (k=2" in out and "3x2/5: tokens/s x" in out
    assert (tmp_path / "spec.png").stat().st_size > 5000
    result = read_record(tmp_path, "spec")["results"]
    assert [(r["k"], r["topk"], r["nodes"]) for r in result["rows"]] == [(2, 1, 3), (3, 2, 5)]
    # every phase recorded GEMMs to replay (no values compared: times belong to the printed table)
    for row in result["rows"]:
        for phase in ("verify", "draft", "extend"):
            assert math.isfinite(row[f"floor_{phase}"]) and row[f"floor_{phase}"] > 0, (phase, row)
    assert math.isfinite(result["floor_decode"]) and result["floor_decode"] > 0


@pytest.mark.slow  # compiles the target's and the head's graphs: a minute or more on a cold cache
def test_bench_spec_prints_each_phase_eager_and_graphed(tmp_path):
    out = run_bench("spec", "--ks", "2", "--trees", "", "--num-prompts", "2", "--max-new-tokens", "8",
                     "--graphs", "--out", str(tmp_path))
    assert "eager vs graphed (graphs.mode=compile), per phase" in out
    result = read_record(tmp_path, "spec")["results"]
    graphed = result["graphed"]
    assert graphed["plain_tokens_per_s"] > 0 and math.isfinite(graphed["t_decode"])
    (row,) = graphed["rows"]
    for phase in ("verify", "draft", "extend"):
        assert math.isfinite(row[f"t_{phase}"]) and row[f"t_{phase}"] > 0, phase
        assert math.isnan(row[f"floor_{phase}"])  # no GEMM is recorded inside a graph
    lines = [line.split() for line in out.splitlines()]
    assert any(line[:2] == ["2", "verify"] and line[-1].endswith("x") for line in lines), out


@pytest.mark.slow  # five engines at batch 16: about 5 s
def test_check_reproducible_reports_every_config_identical():
    out = run_script("check_reproducible.py", "--batch-size", "3", "--max-new-tokens", "8")
    for name in ("plain", "default", "num_steps=5", "adaptive=throughput", "adaptive=ema"):
        assert any(line.startswith(name) and "identical to plain: 3/3" in line for line in out.splitlines()), out
    assert "3 distinct outputs among 3 requests" in out


def test_mutation_run_lists_its_mutants():
    out = run_script("mutation_run.py", "engine/speculative/verify.py", "--list")
    lines = out.splitlines()
    assert lines[0].endswith("mutants in 1 files") and int(lines[0].split()[0]) == len(lines) - 1 > 0
    assert any("'matches.cumprod(dim=1).sum(dim=1) + 1' -> 'matches.cumprod(dim=1).sum(dim=1) - 1'" in line
               for line in lines), out


@pytest.mark.slow
def test_bench_adaptive_charts_the_choices(tmp_path):
    out = run_bench("adaptive", "--batch-sizes", "1", "--num-prompts", "2", "--max-new-tokens", "6",
                     "--out", str(tmp_path), "--plot", str(tmp_path / "adaptive.png"))
    assert "throughput" in out
    rows = read_record(tmp_path, "adaptive")["results"]["1"]["rows"]
    choices = rows["throughput"]["choices"]
    assert choices and sum(n for _, n in choices) == rows["throughput"]["wave_ends"][-1]
    assert not rows["k=3"]["choices"] and len(rows["k=3"]["wave_speeds"]) == len(rows["throughput"]["wave_ends"]) == 4
    assert (tmp_path / "adaptive.png").stat().st_size > 5000


@pytest.mark.slow  # waves of both workloads: about 8 s
def test_bench_adaptive_alternates_code_and_prose_wave_by_wave(tmp_path):
    out = run_bench("adaptive", "--batch-sizes", "1", "--num-prompts", "4", "--max-new-tokens", "4",
                     "--alternate", "wave", "--out", str(tmp_path))
    result = read_record(tmp_path, "adaptive")["results"]["1"]
    rows, ceiling = result["rows"], result["per_wave_ceiling"]
    assert all(set(r["by_kind"]) == {"code", "prose"} for r in rows.values())
    fixed = {n: r for n, r in rows.items() if n == "plain" or n.startswith("k=")}
    for kind, name in ceiling["choice"].items():  # each kind at the fixed setting fastest on it
        assert rows[name]["by_kind"][kind] == max(r["by_kind"][kind] for r in fixed.values())
    # every setting generates the same tokens per kind, so the fastest per kind beats any one of them
    assert ceiling["tokens_per_s"] >= max(r["tokens_per_s"] for r in fixed.values()) * (1 - 1e-9)
    assert "ceiling of a setting chosen per wave:" in out and "code and prose alternating wave by wave" in out


def test_bench_adaptive_workload_alternates_prompts_or_waves():
    from eyas.bench.adaptive import workload

    by_wave = workload(8, 2, "wave")
    assert [kind for kind, _ in by_wave] == ["code", "prose", "code", "prose"]
    by_prompt = workload(8, 2, "prompt")
    assert [kind for kind, _ in by_prompt] == ["mixed"] * 4
    # the same prompts either way, code and prose alternating within each mixed wave
    assert sorted(p for _, w in by_wave for p in w) == sorted(p for _, w in by_prompt for p in w)
    assert by_prompt[0][1] == [by_wave[0][1][0], by_wave[1][1][0]]


@pytest.mark.slow  # two servers start: about 40 s
def test_bench_serve_compares_both_servers(tmp_path):
    plot = tmp_path / "serve.png"
    out = run_bench("serve", "--rates", "8,inf", "--num-requests", "4", "--max-tokens", "8",
                     "--out", str(tmp_path), "--plot", str(plot))
    rows = read_record(tmp_path, "serve")["results"]["rows"]
    assert {(r["rate"], r["system"]) for r in rows} == {(rate, s) for rate in ("8", "inf") for s in ("eyas", "transformers")}
    assert all(r["tokens"] > 0 and r["tok_s"] > 0 for r in rows)
    assert "| inf | eyas |" in out and plot.stat().st_size > 5000


@pytest.mark.slow  # two local Ray deployments start: about a minute and a half
def test_bench_replicas_compares_routings_on_shared_system_prompts(tmp_path):
    out = run_bench("replicas", "--model", "tiny", "--concurrency", "1,4", "--prefixes", "2", "--per-prefix", "3",
                    "--max-tokens", "4", "--out", str(tmp_path))
    rows = read_record(tmp_path, "replicas")["results"]["rows"]
    assert {(r["streams"], r["routing"]) for r in rows} == {
        (streams, routing) for streams in (1, 4, "all") for routing in ("prefix", "round_robin")}
    assert all(r["errors"] == 0 and r["requests"] in (6, 12) and r["tok_s"] > 0 for r in rows)
    assert all(0 < r["hit_rate"] < 1 for r in rows)  # every prompt but a prefix's first finds its system prompt
    assert "| all | prefix |" in out


@pytest.mark.slow  # grammars compiled per engine: about 8 s
def test_bench_structured_compares_masked_and_unmasked_drafts(tmp_path):
    out = run_bench("structured", "--configs", "k=3", "--num-prompts", "2", "--out", str(tmp_path))
    rows = read_record(tmp_path, "structured")["results"]["batch 1"]
    assert set(rows) == {"plain", "k=3 mask_drafts=true", "k=3 mask_drafts=false"}
    assert all(r["valid"] == r["outputs"] == 2 for r in rows.values())  # every record validates
    assert rows["k=3 mask_drafts=true"]["same_as_plain"] and rows["k=3 mask_drafts=false"]["same_as_plain"]
    assert rows["k=3 mask_drafts=true"]["tau"] >= rows["k=3 mask_drafts=false"]["tau"] and "valid outputs" in out
    cost = run_bench("structured", "--mask-cost")
    assert "llguidance:" in cost and "median" in cost


def test_bench_layouts_times_every_float32_layout(tmp_path):
    out = run_bench("layouts", "--rows", "1,7", "--rounds", "1", "--out", str(tmp_path))
    assert out.startswith("49 fused projections, ")
    for rows in (1, 7):
        line = next(line for line in out.splitlines() if line.startswith(f"rows {rows:3d}: "))
        timed = dict(part.split(" ", 1) for part in line.split(": ", 1)[1].split(", "))
        assert {"transposed", "linear", "blocked"} <= set(timed) and timed["transposed"].endswith("(1.00x)")
        assert all(float(v.split(" ms")[0]) > 0 for v in timed.values())  # every layout ran and was timed
        assert "OUTPUTS DIFFER" not in line
    table = read_record(tmp_path, "layouts")["table"]
    assert {(r["rows"], r["layout"]) for r in table} >= {(rows, "transposed") for rows in (1, 7)}
    assert all(r["outputs_agree"] and r["ms"] > 0 for r in table)
    # the report module reads the record: one section with the command, the host and the table
    from eyas.engine.report import write_report

    report = write_report(tmp_path, charts=False).read_text()
    assert "## python -m eyas.bench layouts --rows 1,7 --rounds 1 --out " in report
    assert "| 7 | transposed |" in report and read_record(tmp_path, "layouts")["host"]["cpu"] in report


def test_the_bench_tool_lists_its_subcommands_and_names_the_allowed_ones(capsys):
    listing = run([sys.executable, "-m", "eyas.bench", "--help"])
    from eyas.bench.__main__ import SUBCOMMANDS

    assert list(SUBCOMMANDS) == ["decode", "spec", "adaptive", "sampled", "structured", "prefix", "serve",
                                 "replicas", "peers", "quant", "layouts"]
    assert all(f"  {name} " in listing for name in SUBCOMMANDS)
    done = subprocess.run([sys.executable, "-m", "eyas.bench", "specs"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown subcommand 'specs'; allowed: decode, spec, adaptive" in done.stderr
    # every subcommand is a module with main(argv) and --out, documented under its own prog name
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit) as exited:
            importlib.import_module(f"eyas.bench.{name}").main(["--help"])
        usage = capsys.readouterr().out
        assert exited.value.code == 0 and usage.startswith(f"usage: python -m eyas.bench {name} "), name
        assert "--out OUT" in usage, name
