"""Every option of every config group composes and builds; invalid values fail at start, naming the field;
resolving and validating change nothing they are given."""

import copy
from pathlib import Path

import pytest
from support import build_engine, compose_config
from support.engines import PLAIN

from eyas import ConfigError
from eyas.containers.build import build_container
from eyas.engine.config import prepare, resolve, validate
from eyas.engine.speculative.candidate import parse_candidate
from eyas.launch.compose import config_dir
from eyas.engine.config.schema import Config

GROUPS = ["model", "draft", "speculative", "attention", "adaptive", "sampling", "cache", "experiment"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml"))


def test_config_tree_has_every_group():
    for group in GROUPS:
        assert options(group), f"conf/{group}/ has no option"


SPECULATIVE_GROUPS = {"draft", "speculative"}  # their options pair with each other on the shipped models


def overrides_for(group: str, option: str, checkpoint) -> list[str]:
    if group in SPECULATIVE_GROUPS:
        kind = option if option != "none" else "none"
        return [f"draft={kind}", f"speculative={kind}"]
    if group == "adaptive":  # adaptive speculation needs a draft head: the shipped pair
        return [f"adaptive={option}"]
    if group == "model":  # a directory stands in for the option's own checkpoint (not fetched here): unquantized
        return [*PLAIN, f"model={option}", f"model.path={checkpoint}", "model.quantization=none"]
    return [*PLAIN, f"model.path={checkpoint}", f"{group}={option}"]


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_builds(gqa_checkpoint, group, option):
    container = build_container(compose_config(overrides_for(group, option, gqa_checkpoint)))
    config = container.config()  # resolved, as the schema's dataclasses
    assert isinstance(config, Config)
    engine = container.engine()
    assert engine.scheduler.kv.allocator.num_pages == config.cache.max_total_tokens // config.cache.page_size
    runner = getattr(engine.worker, "target_runner", None) or engine.worker.runner
    assert type(runner.attn_backend).name == config.attention.backend
    if config.draft.kind != "none":
        assert container.speculative.draft_model().kind == config.draft.kind
    elif config.speculative.algorithm == "ngram":  # no draft model: the target captures no features
        assert type(engine.worker.drafter).__name__ == "NgramDrafter"
    if config.adaptive.policy != "off":
        candidates = {parse_candidate(c) for t in config.adaptive.tiers for c in t.candidates}
        assert {parse_candidate(c) for c in engine.worker.candidate_states} == candidates
        assert engine.scheduler.lookahead_tokens == max(c.num_steps for c in candidates) + 1


def test_default_config_runs_eagle3_on_the_shipped_pair():
    config = compose_config([])
    assert config["speculative"]["algorithm"] == config["draft"]["kind"] == "eagle3"
    container = build_container(config)
    engine = container.engine()
    assert container.speculative.draft_model().kind == "eagle3"
    assert engine.worker.target_runner.model.config.num_hidden_layers >= 8


def test_composed_config_is_plain(gqa_checkpoint):
    config = compose_config([*PLAIN, f"model.path={gqa_checkpoint}"])
    assert type(config) is dict and type(config["cache"]) is dict
    assert config["attention"]["backend"] == "torch_native" and isinstance(config["attention"]["backend"], str)


def test_experiment_overlay_overrides_globally(gqa_checkpoint):
    config = compose_config([*PLAIN, f"model.path={gqa_checkpoint}", "experiment=long_generation"])
    assert config["sampling"]["max_new_tokens"] == 512


INVALID = [
    (["cache.page_size=0"], "cache.page_size"),
    (["cache.max_total_tokens=8", "cache.page_size=16"], "cache.max_total_tokens"),
    (["cache.max_running_requests=0"], "cache.max_running_requests"),
    (["cache.max_prefill_tokens=-5"], "cache.max_prefill_tokens"),
    (["cache.max_context_len=1"], "cache.max_context_len"),
    (["cache.page_size=abc"], "page_size"),
    (["cache.bogus=1"], "bogus"),
    (["sampling.temperature=-0.5"], "sampling.temperature"),
    (["sampling.top_p=0"], "sampling.top_p"),
    (["sampling.top_p=1.5"], "sampling.top_p"),
    (["sampling.top_k=-1"], "sampling.top_k"),
    (["sampling.max_new_tokens=0"], "sampling.max_new_tokens"),
    (["sampling.seed=-3"], "sampling.seed"),
    (["attention.backend=flash"], "attention.backend"),
    (["model.dtype=int8"], "model.dtype"),
    (["device=tpu"], "device"),
    (["speculative.num_steps=3"], "speculative.num_steps"),
    (["speculative.topk=0"], "speculative.topk"),
    (["speculative.num_draft_tokens=4"], "speculative.num_draft_tokens"),
    (["speculative.attention_mode=sideways"], "speculative.attention_mode"),
    (["adaptive.policy=magic"], "adaptive.policy"),
    (["prompt=hi", "prompts_file=/tmp/x.txt"], "prompts_file"),
    (["seed=-1"], "seed"),
    (["attention=flash"], "attention"),
    (["attention.backend=triton", "attention.batch_invariant=true"],
     "attention.batch_invariant=true needs attention.backend=torch_native"),
    (["attention.backend=triton", "attention.exact_logprobs=true"],
     "attention.exact_logprobs=true needs attention.backend=torch_native"),
    (["attention.exact_logprobs=maybe"], "attention.exact_logprobs"),
    (["model.quantization=int3"], "model.quantization"),
    (["sampling.logprobs=21"], "sampling.logprobs"),
]


@pytest.mark.parametrize("overrides,field", INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_values_fail_naming_the_field(gqa_checkpoint, overrides, field):
    with pytest.raises(ConfigError) as info:
        prepare(compose_config([*PLAIN, f"model.path={gqa_checkpoint}", *overrides]))
    assert field in str(info.value)


ADAPTIVE_INVALID = [
    (["adaptive=ema", *PLAIN], "adaptive.policy='ema' needs speculative decoding"),
    (["adaptive=ema", "adaptive.ema_alpha=0"], "adaptive.ema_alpha"),
    (["adaptive=ema", "adaptive.ema_alpha=1.5"], "adaptive.ema_alpha"),
    (["adaptive=ema", "adaptive.update_interval=0"], "adaptive.update_interval"),
    (["adaptive=ema", "adaptive.warmup_batches=-1"], "adaptive.warmup_batches"),
    (["adaptive=throughput", "adaptive.probe_interval=-1"], "adaptive.probe_interval"),
    (["adaptive=ema", "adaptive.tiers=[]"], "adaptive.tiers"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:8,candidates:[1]},{batch_size:4,candidates:[1]}]"],
     "adaptive.tiers[1].batch_size"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:1,candidates:[3,1]}]"],
     "adaptive.tiers[0].candidates must list step counts ascending without repeats"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:1,candidates:[1,1]}]"],
     "adaptive.tiers[0].candidates must list step counts ascending without repeats"),
    (["adaptive=throughput", "adaptive.tiers=[{batch_size:1,candidates:[{num_steps:5,topk:4,num_draft_tokens:16},3]}]"],
     "adaptive.tiers[0].candidates must list step counts ascending without repeats, then tree shapes"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:1,candidates:[3,{num_steps:5,topk:4,num_draft_tokens:16}]}]"],
     "tree shapes and other drafters need adaptive.policy=throughput"),
    (["adaptive=throughput", "adaptive.tiers=[{batch_size:1,candidates:[3,{num_steps:5,topk:4,num_draft_tokens:99}]}]"],
     "adaptive.tiers[0].candidates[1].num_draft_tokens must be in 2..69"),
    (["adaptive=throughput", "adaptive.tiers=[{batch_size:1,candidates:[3,{num_steps:5,topk:1,num_draft_tokens:6}]}]"],
     "topk 1 is the chain"),
    (["adaptive=throughput", "adaptive.tiers=[{batch_size:1,candidates:[3,{num_steps:5,topk:4}]}]"],
     "adaptive.tiers[0].candidates[1] must be a step count >= 0, a tree shape"),
    (["adaptive=throughput",
      "adaptive.tiers=[{batch_size:1,candidates:[{num_steps:2,topk:2,num_draft_tokens:4},{num_steps:2,topk:2,num_draft_tokens:4}]}]"],
     "lists a candidate twice"),
    (["adaptive=throughput", "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:medusa,num_steps:4}]}]"],
     "adaptive.tiers[0].candidates[1].drafter must be one of ['ngram', 'suffix', 'hybrid']"),
    (["adaptive=throughput", "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:ngram,num_steps:0}]}]"],
     "adaptive.tiers[0].candidates[1].num_steps must be an integer >= 1"),
    (["adaptive=throughput", "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:ngram,num_steps:3,topk:2}]}]"],
     "adaptive.tiers[0].candidates[1] must be a step count >= 0"),
    (["adaptive=throughput",
      "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:ngram,num_steps:3,topk:2,num_draft_tokens:99}]}]"],
     "adaptive.tiers[0].candidates[1].num_draft_tokens must be in 2..11"),
    (["adaptive=throughput",
      "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:ngram,num_steps:4},{drafter:ngram,num_steps:4}]}]"],
     "lists a candidate twice"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:ngram,num_steps:4}]}]"],
     "tree shapes and other drafters need adaptive.policy=throughput"),
    (["adaptive=throughput", "speculative=hybrid", "draft=eagle3",
      "adaptive.tiers=[{batch_size:1,candidates:[{drafter:hybrid,num_steps:4}]}]"],
     "adaptive.tiers[0].candidates[0].drafter must be one of ['ngram', 'suffix']"),
    (["adaptive=throughput", "speculative=ngram", "draft=none",
      "adaptive.tiers=[{batch_size:1,candidates:[{drafter:hybrid,num_steps:4}]}]"],
     "other drafters need the draft head they share state with"),
    (["adaptive=throughput", "speculative.suffix_max_tokens=10",
      "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:suffix,num_steps:8}]}]"],
     "speculative.suffix_max_tokens must be an integer in 1024..16777216"),
    (["adaptive=throughput", "speculative.ngram_max_match=0",
      "adaptive.tiers=[{batch_size:1,candidates:[3,{drafter:ngram,num_steps:4}]}]"],
     "speculative.ngram_max_match"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:1,candidates:[-1,2]}]"], "adaptive.tiers[0].candidates"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:1,candidates:[]}]"], "adaptive.tiers[0].candidates"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:0,candidates:[1]}]"], "adaptive.tiers[0].batch_size"),
    (["adaptive=ema", "adaptive.tiers=[{batch_size:1}]"], "candidates"),
]


@pytest.mark.parametrize("overrides,message", ADAPTIVE_INVALID, ids=[" ".join(o) for o, _ in ADAPTIVE_INVALID])
def test_invalid_adaptive_values_fail_naming_the_field(gqa_checkpoint, overrides, message):
    with pytest.raises(ConfigError) as info:
        prepare(compose_config(overrides))
    assert message in str(info.value)


@pytest.mark.parametrize("algorithm,draft", [("ngram", "none"), ("standalone", "standalone"), ("hybrid", "eagle3")])
def test_other_drafters_a_configured_drafter_cannot_host_are_left_out_and_said(algorithm, draft):
    """The shipped tiers list suffix, n-gram and hybrid candidates for the EAGLE heads: with another drafter
    they are left out (its own chains stay), said when adaptive.policy was set, silently under `auto`."""
    listed = "adaptive.tiers=[{batch_size:1,candidates:[2,3,{drafter:hybrid,num_steps:4},{drafter:suffix,num_steps:8}]}]"
    kept = [2, 3] if algorithm != "hybrid" else [2, 3, {"drafter": "suffix", "num_steps": 8}]
    for policy, said in (("throughput", True), ("auto", False)):
        config, notices = prepare(compose_config([f"speculative={algorithm}", f"draft={draft}", f"adaptive={policy}",
                                                  "speculative.num_steps=3", listed]))
        assert config["adaptive"]["policy"] == "throughput" and config["adaptive"]["tiers"][0]["candidates"] == kept
        assert bool(notices) == said and (not said or "left out with speculative.algorithm" in notices[0])
    config, notices = prepare(compose_config([f"speculative={algorithm}", f"draft={draft}"]))  # the shipped tiers
    assert notices == [] and all(not isinstance(c, dict) or c["drafter"] != algorithm
                                 for tier in config["adaptive"]["tiers"] for c in tier["candidates"])


def test_initial_steps_not_a_candidate_start_at_the_middle_and_say_so():
    config, notices = prepare(compose_config(["adaptive=ema", "speculative.num_steps=4"]))
    assert (config["speculative"]["num_steps"], config["speculative"]["num_draft_tokens"]) == (5, 6)
    assert "speculative.num_steps=4 is not a candidate" in notices[0] and "notices" not in config
    config, notices = prepare(compose_config(["adaptive=ema", "speculative.num_steps=3"]))
    assert config["speculative"]["num_steps"] == 3 and notices == []
    assert prepare(compose_config(["adaptive=off", "speculative.num_steps=4"]))[1] == []  # adaptive off: any step count


RESOLVING = [
    [],  # adaptive auto -> throughput, num_draft_tokens filled
    PLAIN,  # auto -> off
    ["adaptive=ema", "speculative.num_steps=4"],  # starts at the first tier's middle candidate
    ["speculative.topk=4", "speculative.num_steps=2"],  # a tree: auto -> off, its default node count
    ["adaptive=throughput", "speculative.topk=4", "speculative.num_steps=2", "speculative.num_draft_tokens=8"],
    ["adaptive=throughput", "speculative=hybrid", "draft=eagle3", "speculative.num_steps=3",  # starts at ngram:4
     "adaptive.tiers=[{batch_size:4,candidates:[{drafter:ngram,num_steps:4},{num_steps:2,topk:2,num_draft_tokens:5}]}]"],
]


@pytest.mark.parametrize("overrides", RESOLVING, ids=[" ".join(o) or "default" for o in RESOLVING])
def test_resolve_is_idempotent_and_neither_step_changes_its_input(overrides):
    composed = compose_config(overrides)
    given = copy.deepcopy(composed)
    resolved, notices = resolve(composed)
    assert composed == given  # resolving returns a copy
    assert resolved["speculative"]["num_draft_tokens"] is not None and resolved["adaptive"]["policy"] != "auto"
    assert resolve(resolved) == (resolved, [])  # a resolved config resolves to itself, with no notices
    checked = copy.deepcopy(resolved)
    validate(resolved)
    assert resolved == checked
    assert prepare(composed) == (resolved, notices)


def test_enum_errors_list_allowed_values(gqa_checkpoint):
    with pytest.raises(ConfigError, match="torch_native"):
        compose_config([*PLAIN, f"model.path={gqa_checkpoint}", "attention.backend=flash"])
    with pytest.raises(ConfigError, match=r"speculative.verify(.|\n)*reproducible(.|\n)*rejection"):
        compose_config([f"model.path={gqa_checkpoint}", "speculative.verify=exact"])


def test_missing_model_path_names_it():
    with pytest.raises(ConfigError, match="model.path"):
        compose_config(["model.path=???"])


def test_build_engine_rejects_bad_checkpoint_path():
    from eyas import CheckpointError

    with pytest.raises(CheckpointError, match="model.path"):
        build_engine(["model.path=/no/such/dir"])


def test_the_package_default_is_smollm2_from_its_gguf_file_with_its_eagle3_head():
    """What `python -m eyas` composes with no override (the tests build on model=tiny unless they choose)."""
    from eyas.engine.assets import asset_path
    from eyas.launch.compose import compose_config as package_config

    config = package_config([])
    assert config["model"]["path"] == "smollm2" and config["model"]["quantization"] == "auto"
    assert config["speculative"]["algorithm"] == "eagle3" and config["draft"]["path"] == str(asset_path("smollm2_eagle3"))
    assert compose_config([])["model"]["path"] == str(asset_path("target"))


def test_graphs_default_to_auto_and_eyas_graphs_mode_sets_the_default():
    """`python -m eyas` with no override composes graphs.mode=auto; EYAS_GRAPHS_MODE in the environment
    changes the default (the tests run eager so) and an override still wins; a bad value names the field."""
    import os
    import subprocess
    import sys

    def mode(env_mode: str | None, *overrides: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "EYAS_GRAPHS_MODE"}
        if env_mode is not None:
            env["EYAS_GRAPHS_MODE"] = env_mode
        return subprocess.run([sys.executable, "-m", "eyas", "--cfg", "job", "--package", "graphs", "--resolve",
                               *overrides],
                              env=env, capture_output=True, text=True, timeout=120)

    assert "mode: auto" in mode(None).stdout
    assert "mode: eager" in mode("eager").stdout
    assert "mode: aot" in mode("eager", "graphs.mode=aot").stdout
    bad = subprocess.run([sys.executable, "-m", "eyas", "sampling.max_new_tokens=1"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "EYAS_GRAPHS_MODE": "fast"})
    assert bad.returncode != 0 and "graphs.mode" in bad.stderr and "eager" in bad.stderr


@pytest.mark.parametrize("group,key,value,allowed", [
    ("model", "dtype", "float64", "auto, float32, float16, bfloat16"),
    ("attention", "backend", "flash", "torch_native, triton"),
    ("sampling", "seed", "abc", "Integer"),
])
def test_a_config_dict_is_checked_by_the_schema_commands_compose_with(gqa_checkpoint, group, key, value, allowed):
    """`build_engine(config=...)`: a dict written by hand meets the checks a composed config meets."""
    config = compose_config([*PLAIN, f"model.path={gqa_checkpoint}"])
    config[group][key] = value
    with pytest.raises(ConfigError) as info:
        build_engine(config=config)
    assert f"{group}.{key}" in str(info.value) and allowed in str(info.value)
