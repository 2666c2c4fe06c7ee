"""Greedy decoding throughput of eyas against llama.cpp, CTranslate2 and transformers on one target.

Every system decodes the same held-out prompts (`--workload`: stdlib code by default, or package
source, docstrings, prose, or requests that repeat earlier ones; bench/workloads.py; token ids from the target's tokenizer),
greedy, exactly `--max-new-tokens` new tokens per prompt (eos ignored), on the CPU, in one
process. For each batch size each system gets one untimed warmup batch, then `--rounds` waves; a
wave is `--num-prompts` prompts rounded up to whole batches (at batch 1: that many prompts, one at a
time), every system runs the same wave, and the order of the systems rotates from wave to wave so
that drift of the machine falls on all alike. tok/s = generated tokens / summed wall time of the
waves, prefill included. Each system's greedy ids are compared with eyas plain's, row by row.

    python -m eyas.bench peers                                   # all systems, batch 1, 8, 32, 96 new tokens
    python -m eyas.bench peers --systems ct2,hf,eyas --batch-sizes 1,8 --max-new-tokens 16 --num-prompts 2 --rounds 1
    python -m eyas.bench peers --workload repeated --systems eyas,eyas_adaptive,fixed --batch-sizes 1 --num-prompts 8
    python -m eyas.bench peers --model smollm2 --workload chat --batch-sizes 1 --num-prompts 8 \
        --systems llama_cpp,ct2,ct2_int8,hf,eyas,eyas_gguf_f32,eyas_dequant,eyas_adaptive
    python -m eyas.bench peers --model smollm2 --starts --systems eyas,eyas_aot,eyas_adaptive_aot,eyas_adaptive_auto

`--model` names the target as `model=` does (tiny, the shipped pair, by default; smollm2: its GGUF file).
On a GGUF target eyas runs the file's own blocks (`model.quantization=gguf`: int8 activations),
eyas_gguf_f32 the same blocks with float32 activations and eyas_dequant the dequantized float32 model;
llama_cpp is llama.cpp (llama-cpp-python) on the same file at its fastest thread count (timed at
start), prompts one at a time (batch 1 only); CTranslate2 (ct2 float32, ct2_int8) and transformers run
the dequantized checkpoint transformers builds from the file. The chat workload renders held-out user
messages in the target's chat template.

Systems (`--systems`, short names): ct2 (CTranslate2, converted here from the same checkpoint),
hf (transformers `generate`), hf_lookup (prompt lookup, 10 tokens), hf_assisted (the shipped draft
LM as assistant model), eyas (plain decoding), eyas_spec (EAGLE-3, a fixed k = 3: `adaptive=off`),
eyas_adaptive (the default config: EAGLE-3 chains beside suffix decoding candidates under
`adaptive=throughput`), eyas_ngram (`speculative=ngram`: prompt lookup; its lookup
cost per step is printed), eyas_standalone (`speculative=standalone`: the shipped draft LM),
eyas_hybrid (`speculative=hybrid`: the EAGLE-3 head and n-gram lookup) and eyas_tree (an EAGLE-3
tree: topk 4, 5 steps, 16 nodes), eyas_suffix (`speculative=suffix`), eyas_hybrid_suffix (the hybrid
over suffix decoding's lookup) and eyas_k1 .. eyas_k6 (EAGLE-3 at a fixed k); `--systems fixed` names
every fixed drafter configuration (n-gram, hybrids, tree, suffix, k = 1..6), and each `--eyas
NAME=OVERRIDES` adds one of your own. The default's choices (its share of cycles per candidate) and
its ratio to the fastest fixed configuration are printed per batch size; eyas_graphs and eyas_adaptive_graphs are eyas and eyas_adaptive with
`graphs.mode=compile` (compiled when the engine is built, before any timing), eyas_aot and eyas_adaptive_aot
with `graphs.mode=aot`; every other eyas system runs eager unless its overrides name a graphs mode. eyas_auto and
eyas_adaptive_auto run the default, `graphs.mode=auto`, as a user gets it: on an empty package directory
(`--graphs-cache`, by default one of this run) they start eager while a background process compiles their
packages and swap them in when it ends (their graphs state is printed after each batch size); on a directory
holding them, they load them at start (a second start). The aot systems keep their packages there too and
are built first: beside them, the auto system of the same config loads what they compiled. `--starts` first times `python -m eyas` itself: eager, a first start
and a second start of the default (wall seconds, tok/s). The ratios of eyas_ngram and eyas_standalone to transformers'
prompt lookup and assisted generation are printed too. transformers' prompt lookup and assisted
generation run at batch 1 only. Needs the optional packages: pip install '.[bench]'.
"""

import argparse
import fcntl
import importlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from eyas import build_engine
from eyas.bench.decode import agreement, eyas_generate, load_hf
from eyas.bench.record import add_out_argument, scalars, write_record
from eyas.bench.workloads import CHAT_WORKLOADS, WORKLOADS, chat_prompts_for, workload_prompts
from eyas.engine.assets import asset_path
from eyas.engine.graphs.exported import package_dir
from eyas.engine.models.checkpoint_source import checkpoint_directory, gguf_source
from eyas.engine.report.figures import pyplot, save
from eyas.engine.tokenizer import Tokenizer
from eyas.launch.compose import compose_config

SYSTEMS = {"llama_cpp": "llama.cpp plain", "ct2": "ct2 plain", "ct2_int8": "ct2 int8", "hf": "transformers plain", "hf_lookup": "transformers prompt lookup",
           "hf_assisted": "transformers assisted", "eyas": "eyas plain", "eyas_spec": "eyas EAGLE-3 k=3",
           "eyas_adaptive": "eyas adaptive (default)", "eyas_ngram": "eyas n-gram", "eyas_standalone": "eyas standalone",
           "eyas_hybrid": "eyas hybrid", "eyas_tree": "eyas EAGLE-3 tree 5x4/16",
           "eyas_suffix": "eyas suffix", "eyas_hybrid_suffix": "eyas hybrid, suffix lookup",
           "eyas_graphs": "eyas plain, compiled", "eyas_adaptive_graphs": "eyas adaptive (default), compiled",
           "eyas_dequant": "eyas plain, dequantized float32", "eyas_gguf_f32": "eyas plain, file blocks, f32 activations",
           "eyas_aot": "eyas plain, AOT-compiled", "eyas_adaptive_aot": "eyas adaptive (default), AOT-compiled",
           "eyas_auto": "eyas plain, graphs auto", "eyas_adaptive_auto": "eyas default, as started",
           **{f"eyas_k{k}": f"eyas EAGLE-3 k={k}" for k in range(1, 7)}}
BATCH1_ONLY = {"hf_lookup", "hf_assisted", "llama_cpp"}
GGUF_ONLY = {"llama_cpp", "eyas_dequant", "eyas_gguf_f32"}  # systems that read a GGUF file
# every speculative row but the default's runs its configured step count (adaptive=off)
EYAS_OVERRIDES = {"eyas": ["speculative=none", "draft=none"], "eyas_spec": ["adaptive=off"],
                  "eyas_adaptive": [], "eyas_ngram": ["speculative=ngram", "adaptive=off"],
                  "eyas_standalone": ["speculative=standalone", "adaptive=off"],
                  "eyas_hybrid": ["speculative=hybrid", "adaptive=off"],
                  "eyas_tree": ["adaptive=off", "speculative.topk=4", "speculative.num_steps=5",
                                "speculative.num_draft_tokens=16"],
                  "eyas_suffix": ["speculative=suffix", "adaptive=off"],
                  "eyas_hybrid_suffix": ["speculative=hybrid", "speculative.hybrid_lookup=suffix", "adaptive=off"],
                  "eyas_graphs": ["speculative=none", "draft=none", "graphs.mode=compile"],
                  "eyas_adaptive_graphs": ["graphs.mode=compile"],
                  "eyas_dequant": ["speculative=none", "draft=none", "model.quantization=none"],
                  "eyas_gguf_f32": ["speculative=none", "draft=none", "model.quantization=gguf_f32"],
                  "eyas_aot": ["speculative=none", "draft=none", "graphs.mode=aot"],
                  "eyas_adaptive_aot": ["graphs.mode=aot"],
                  "eyas_auto": ["speculative=none", "draft=none", "graphs.mode=auto"],
                  "eyas_adaptive_auto": ["graphs.mode=auto"],
                  **{f"eyas_k{k}": ["adaptive=off", f"speculative.num_steps={k}"] for k in range(1, 7)}}
GRAPH_MODE = "graphs.mode=eager"  # of every eyas system that names none: the default (auto) is eyas_*auto's
# the fixed configurations the default is held against (`--systems fixed` names them all)
FIXED = ["eyas_ngram", "eyas_hybrid", "eyas_tree", "eyas_suffix", "eyas_hybrid_suffix", *(f"eyas_k{k}" for k in range(1, 7))]
# the default speculative configuration and plain decoding in one graphs mode: their ratio is printed per batch
SPECULATIVE_VS_PLAIN = [("eyas_adaptive", "eyas"), ("eyas_adaptive_aot", "eyas_aot"), ("eyas_adaptive_auto", "eyas_auto"),
                        ("eyas_adaptive_graphs", "eyas_graphs")]
# eyas drafters and the transformers peer that drafts the same way: their ratio is printed per batch
PEERS = {"eyas_ngram": "hf_lookup", "eyas_standalone": "hf_assisted"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eyas.bench peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default=",".join(s for s in SYSTEMS if s not in FIXED[5:]),
                   help=f"comma-separated subset of {','.join(SYSTEMS)}; 'fixed' adds {','.join(FIXED)}")
    p.add_argument("--eyas", action="append", default=[], metavar="NAME=OVERRIDES",
                   help="another eyas system: a name and its config overrides, space-separated (repeatable)")
    p.add_argument("--model", default="tiny", help="the target, as model= names it (conf/model: tiny, smollm2)")
    p.add_argument("--workload", default="stdlib", choices=WORKLOADS + CHAT_WORKLOADS,
                   help="the prompts (bench/workloads.py); chat: rendered with the target's chat template")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per wave, rounded up to whole batches")
    p.add_argument("--rounds", type=int, default=2, help="timed waves per batch size")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--ct2-threads", type=int, default=0, help="ct2 intra_threads (0: the fastest, timed at start)")
    p.add_argument("--llama-threads", type=int, default=0, help="llama.cpp threads (0: the fastest, timed at start)")
    p.add_argument("--graphs-cache", default=None, metavar="DIR",
                   help="graphs.cache_dir of the graphs.mode=auto systems (eyas_auto, eyas_adaptive_auto) and of "
                        "--starts: packages found there load at start (a second start); default: an empty directory "
                        "of this run (a first start: eager while a background process compiles them)")
    p.add_argument("--starts", action="store_true",
                   help="first time `python -m eyas` as a user starts it (--model, no other override): eager, then "
                        "the default on an empty package directory (first start), then again once its background "
                        "compile has ended (second start)")
    add_out_argument(p, "peers")
    args = p.parse_args(argv)
    named = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.systems = list(dict.fromkeys(x for s in named for x in (FIXED if s == "fixed" else [s])))
    for spec in args.eyas:
        name, _, overrides = spec.partition("=")
        if not name or not overrides:
            p.error(f"--eyas takes NAME=OVERRIDES, got {spec!r}")
        SYSTEMS[name], EYAS_OVERRIDES[name] = f"eyas {name}", overrides.split()
        if name not in args.systems:  # named in --systems too: one row
            args.systems.append(name)
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; allowed: {','.join(SYSTEMS)}")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    return args


def optional(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        sys.exit(f"{module} is needed for this benchmark: pip install '.[bench]' ({e})")


def make_waves(pool: list[list[int]], batch: int, num_prompts: int, rounds: int) -> list[list[list[list[int]]]]:
    # wave 0 is the warmup; each wave: batches of `batch` prompts, each prompt a list of token ids
    per_wave = batch * math.ceil(num_prompts / batch)
    waves = [pool[w * per_wave:(w + 1) * per_wave] for w in range(rounds + 1)]
    return [[wave[i:i + batch] for i in range(0, per_wave, batch)] for wave in waves]


def load_ct2(model_dir: str, out_dir: str, threads: int, probe: list[int], compute_type: str = "float32"):
    """The converted model's generator at its fastest intra_threads: `threads`, or when 0 the faster of
    1 .. cpu count timed here on `probe` (on a 2-core machine 2 threads can be several times slower).
    `compute_type` is CTranslate2's weight type for conversion and compute (float32, int8, ...)."""
    ctranslate2 = optional("ctranslate2")
    optional("transformers")  # the converter reads the checkpoint through it
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(model_dir).convert(out_dir, quantization=compute_type, force=True)
    vocab = json.loads((Path(out_dir) / "vocabulary.json").read_text())  # index = token id
    torch_threads = torch.get_num_threads()

    def make(t: int):
        # a Generator sets the process's OpenMP thread count (torch's too) to its intra_threads: restore it
        generator = ctranslate2.Generator(out_dir, device="cpu", compute_type=compute_type, intra_threads=t)
        torch.set_num_threads(torch_threads)
        return generator

    if threads:
        return make(threads), vocab, threads
    timings = {}
    for t in range(1, (os.cpu_count() or 1) + 1):
        generator = make(t)
        ct2_generate(generator, vocab, [probe], 8)  # warmup
        start = time.perf_counter()
        ct2_generate(generator, vocab, [probe], 48)
        timings[t] = (time.perf_counter() - start, generator)
        del generator
    best = min(timings, key=lambda t: timings[t][0])
    print("ct2 intra_threads probe (s for 48 tokens): " + ", ".join(f"{t}: {v[0]:.3f}" for t, v in timings.items())
          + f" -> {best}")
    return timings[best][1], vocab, best


def ct2_generate(generator, vocab: list[str], prompts: list[list[int]], n: int) -> list[list[int]]:
    # with include_prompt_in_result=False, max_length counts new tokens only (checked: each row has n)
    results = generator.generate_batch([[vocab[i] for i in p] for p in prompts], max_length=n, min_length=n,
                                       sampling_topk=1, include_prompt_in_result=False, end_token=[])
    return [r.sequences_ids[0] for r in results]  # ids are indices into vocabulary.json


def hf_generate(model, prompts: list[list[int]], n: int, **kwargs) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    # left padding with id 0: [B, width] ids and mask (1 = real token)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n, **kwargs)
    return out[:, width:].tolist()  # [B, n] generated ids only


class EyasRunner:
    """An eyas engine as a runner: a batch of token-id prompts -> generated ids."""

    def __init__(self, engine, max_new_tokens: int):
        self.engine, self.max_new_tokens = engine, max_new_tokens

    def __call__(self, prompts: list[list[int]]) -> list[list[int]]:
        return eyas_generate(self.engine, prompts, self.max_new_tokens)


def dequantized_checkpoint(directory: Path, out: str) -> str:
    """A GGUF target as the float32 Hugging Face checkpoint transformers builds from the file (written to `out`),
    which CTranslate2 and transformers read; any other target's own directory."""
    source = gguf_source(directory)
    if source is None:
        return str(directory)
    optional("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=str(source), dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):  # transformers will not save a model it loaded from GGUF
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(directory)).save_pretrained(out)
    return out


def load_llama_cpp(path: Path, threads: int, probe: list[int]):
    """llama.cpp on the GGUF file at its fastest thread count: `threads`, or when 0 the faster of 1 .. cpu count
    timed here on `probe`. Returns (generate(prompts, n), threads)."""
    llama_cpp = optional("llama_cpp")

    def make(t: int):
        llm = llama_cpp.Llama(model_path=str(path), n_threads=t, n_threads_batch=t, n_ctx=2048, verbose=False)

        def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
            rows = []
            for prompt in prompts:  # one at a time: llama-cpp-python decodes one sequence
                row = []
                for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):  # greedy; eos does not stop it
                    row.append(int(token))
                    if len(row) == n:
                        break
                rows.append(row)
            return rows
        return generate

    if threads:
        return make(threads), threads
    timings = {}
    for t in range(1, (os.cpu_count() or 1) + 1):
        generate = make(t)
        generate([probe], 8)  # warmup
        start = time.perf_counter()
        generate([probe], 48)
        timings[t] = (time.perf_counter() - start, generate)
    best = min(timings, key=lambda t: timings[t][0])
    print("llama.cpp threads probe (s for 48 tokens): " + ", ".join(f"{t}: {v[0]:.3f}" for t, v in timings.items())
          + f" -> {best}")
    return timings[best][1], best


def make_runners(args, pool: list[list[int]], tmp: str) -> tuple[dict, list]:
    # name -> fn(batch of token-id prompts) -> generated ids; plus the engines to close at the end
    target, n, runners, engines = args.target_dir, args.max_new_tokens, {}, []
    if {"ct2", "ct2_int8", "hf", "hf_lookup", "hf_assisted"} & set(args.systems):
        target = dequantized_checkpoint(args.target_dir, os.path.join(tmp, "hf"))
    if "llama_cpp" in args.systems:
        llama_generate, args.llama_threads = load_llama_cpp(gguf_source(args.target_dir), args.llama_threads, pool[0])
        runners["llama_cpp"] = lambda ps: llama_generate(ps, n)
    for name, compute_type in (("ct2", "float32"), ("ct2_int8", "int8")):
        if name in args.systems:
            generator, vocab, threads = load_ct2(target, os.path.join(tmp, name), args.ct2_threads, pool[0], compute_type)
            runners[name] = lambda ps, generator=generator, vocab=vocab: ct2_generate(generator, vocab, ps, n)
            print(f"{name} intra_threads {threads}")
    if {"hf", "hf_lookup", "hf_assisted"} & set(args.systems):
        optional("transformers")
        hf = load_hf(target, "cpu")
        runners["hf"] = lambda ps: hf_generate(hf, ps, n)
        runners["hf_lookup"] = lambda ps: hf_generate(hf, ps, n, prompt_lookup_num_tokens=10)
        if "hf_assisted" in args.systems:
            if args.model != "tiny":
                sys.exit("hf_assisted drafts with the shipped draft LM, which only --model tiny has")
            assistant = load_hf(asset_path("draft_lm"), "cpu")
            runners["hf_assisted"] = lambda ps: hf_generate(hf, ps, n, assistant_model=assistant)
    # size the pool and admission limits so a whole batch is admitted in its first step
    batch, longest = max(args.batch_sizes), max(len(p) for p in pool)
    cache = [f"cache.max_running_requests={batch}", f"cache.max_prefill_tokens={batch * longest}",
             f"cache.max_total_tokens={batch * (longest + n + 48)}"]  # + 48: page rounding, draft lookahead
    for name in EYAS_OVERRIDES:
        if name in args.systems:
            eng = build_engine(overrides=[f"model={args.model}", "device=cpu", "model.dtype=float32",
                                          *graphs_of(EYAS_OVERRIDES[name], args.graphs_cache), *cache])
            engines.append(eng)
            runners[name] = EyasRunner(eng, n)
    return {s: runners[s] for s in args.systems}, engines


def graphs_of(overrides: list[str], cache_dir: str) -> list[str]:
    """A system's overrides with its graphs mode named (eager unless it names one: the default, auto, compiles
    in the background and swaps in mid-run), the packages of aot and auto kept in `cache_dir`: an aot system,
    built first, compiles what the auto system of its config then loads at start."""
    mode = next((o.split("=", 1)[1] for o in overrides if o.startswith("graphs.mode=")), None)
    if mode is None:
        return [*overrides, GRAPH_MODE]
    return [*overrides, f"graphs.cache_dir={cache_dir}"] if mode in ("aot", "auto") else overrides


def graphs_state(runner) -> str | None:
    """An eyas runner's graphs under graphs.mode=auto: compiling, graphs (swapped in), eager or failed."""
    engine = getattr(runner, "engine", None)
    return engine.metrics().get("graphs_state") if engine is not None else None


def measure_starts(model: str, cache_dir: str, work: str) -> list[dict]:
    """`python -m eyas model=MODEL` timed as a user starts it (wall seconds to its exit, its tok/s and graphs
    state): eager; the default (graphs.mode=auto) on `cache_dir` (empty: a first start, eager while the
    packages compile in the background); the default again once that compile has ended (a second start)."""
    env = {k: v for k, v in os.environ.items() if k != "EYAS_GRAPHS_MODE"}  # the default as a user has it
    starts = []
    for label, overrides in (("eager", ["graphs.mode=eager"]), ("first start", []), ("second start", [])):
        if label == "second start":
            waited = wait_for_compile(package_dir(cache_dir))
            print(f"  start: the background compile ended {waited:.0f} s after the first start did")
        command = [sys.executable, "-m", "eyas", f"model={model}", f"graphs.cache_dir={cache_dir}", *overrides,
                   f"hydra.run.dir={work}/start-{len(starts)}"]
        began = time.perf_counter()
        ran = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - began
        if ran.returncode != 0:
            sys.exit(f"{' '.join(command)} failed:\n{ran.stderr[-2000:]}")
        summary = next(line for line in ran.stdout.splitlines() if line.startswith("requests "))
        rate = float(summary.split(" tok/s")[0].rsplit("| ", 1)[1])
        state = summary.rsplit("| graphs ", 1)[1].strip() if "| graphs " in summary else "eager"
        starts.append(dict(start=label, wall_s=wall, tok_s=rate, graphs=state))
        print(f"  start: {label}: {wall:.1f} s wall, {rate:.1f} tok/s, graphs {state}")
    return starts


def wait_for_compile(directory: Path) -> float:
    """Seconds until no background compile holds `directory`'s lock (each holds it until it exits)."""
    began = time.perf_counter()
    with open(directory / "compile.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_UN)
    return time.perf_counter() - began


def lookup_cost(runner) -> tuple[float, int] | None:
    """(seconds, steps) an eyas runner's lookup drafters (n-gram, suffix) have spent so far; None without one."""
    drafter = getattr(getattr(getattr(runner, "engine", None), "worker", None), "drafter", None)
    lookups = list(getattr(drafter, "lookups", {}).values()) or [drafter]  # the hybrid holds its lookups
    lookups = [d for d in lookups if hasattr(d, "lookup_seconds")]
    if not lookups:
        return None
    return sum(d.lookup_seconds for d in lookups), max(d.lookup_steps for d in lookups)


def adaptive_cycles(runner) -> dict:
    """Cycles per candidate an eyas runner's adaptive policy has chosen so far (empty without one)."""
    engine = getattr(runner, "engine", None)
    return dict(engine.metrics().get("adaptive_cycles_at_steps", {})) if engine is not None else {}


def choice_summary(before: dict, after: dict) -> str:
    """The candidates chosen between two readings, most cycles first, with their share of cycles."""
    cycles = {c: n - before.get(c, 0) for c, n in after.items() if n > before.get(c, 0)}
    total = sum(cycles.values()) or 1
    return ", ".join(f"{c} {n / total:.0%}" for c, n in sorted(cycles.items(), key=lambda x: -x[1]))


def bench_batch(runners: dict, waves: list, n: int) -> dict:
    # returns name -> (tok/s, generated rows over the timed waves)
    for fn in runners.values():
        fn(waves[0][0])  # warmup: one batch
    names, seconds, outs = list(runners), dict.fromkeys(runners, 0.0), {s: [] for s in runners}
    for w, wave in enumerate(waves[1:]):
        for name in names[w % len(names):] + names[:w % len(names)]:
            start = time.perf_counter()
            rows = [row for ps in wave for row in runners[name](ps)]
            seconds[name] += time.perf_counter() - start
            assert all(len(r) == n for r in rows), f"{name} did not generate exactly {n} tokens per row"
            outs[name] += rows
    return {s: (len(outs[s]) * n / seconds[s], outs[s]) for s in names}


def baseline(systems: list[str]) -> str | None:
    """The system ratios are taken to: llama.cpp, else CTranslate2, else eyas plain (the first that ran)."""
    return next((s for s in ("llama_cpp", "ct2", "eyas") if s in systems), None)


def summarize(args, results: dict) -> list[dict]:
    # one dict per (batch, system); ratio to the baseline system
    base = baseline(args.systems)
    rows = []
    for b, res in results.items():
        ref = res.get("eyas", (None, None))[1]
        for s in args.systems:
            if s not in res:
                rows.append(dict(batch=b, system=SYSTEMS[s], tok_s=None, ratio=None, baseline=None,
                                 equal="n/a (batch 1 only)"))
                continue
            tps, out = res[s]
            equal = "n/a" if ref is None else "reference" if s == "eyas" else agreement(out, ref)
            rows.append(dict(batch=b, system=SYSTEMS[s], tok_s=tps, ratio=tps / res[base][0] if base in res else None,
                             baseline=SYSTEMS[base] if base else None, equal=equal))
    return rows


def peer_ratios(results: dict) -> list[dict]:
    """Each eyas drafter against the transformers system that drafts the same way, where both ran."""
    return [dict(batch=b, system=SYSTEMS[ours], peer=SYSTEMS[peer], ratio=res[ours][0] / res[peer][0])
            for b, res in results.items() for ours, peer in PEERS.items() if ours in res and peer in res]


def print_tables(rows: list[dict], base: str) -> None:
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    for b in dict.fromkeys(r["batch"] for r in rows):
        print(f"\nbatch {b}")
        print(f"{'system':<28} {'tok/s':>8} {'/ ' + base:>20}  greedy ids vs eyas plain")
        for r in (r for r in rows if r["batch"] == b):
            print(f"{r['system']:<28} {fmt(r['tok_s'], '8.1f'):>8} {fmt(r['ratio'], '.2f'):>20}  {r['equal']}")
    print(f"\n| batch | system | tok/s | / {base} | greedy ids vs eyas plain |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['system']} | {fmt(r['tok_s'], '.1f')} | {fmt(r['ratio'], '.2f')} | {r['equal']} |")


def plot(rows: list[dict], base: str, path: Path) -> None:
    plt = pyplot()
    batches, systems = list(dict.fromkeys(r["batch"] for r in rows)), list(dict.fromkeys(r["system"] for r in rows))
    width = 0.8 / len(systems)
    fig, (ax_tps, ax_ratio) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, s in enumerate(systems):
        mine = [r for r in rows if r["system"] == s]
        x = {r["batch"]: batches.index(r["batch"]) + (i - (len(systems) - 1) / 2) * width for r in mine}
        got = [r for r in mine if r["tok_s"] is not None]
        bars = ax_tps.bar([x[r["batch"]] for r in got], [r["tok_s"] for r in got], width, label=s, color=f"C{i}")
        ax_tps.bar_label(bars, fmt="%.0f", fontsize=7)
        got = [r for r in got if r["ratio"] is not None]  # none where the baseline runs at batch 1 only
        if got:
            bars = ax_ratio.bar([x[r["batch"]] for r in got], [r["ratio"] for r in got], width, color=f"C{i}")
            ax_ratio.bar_label(bars, fmt="%.2f", fontsize=7)
        for r in mine:
            if r["tok_s"] is None:  # batch-1-only systems at larger batches
                ax_ratio.text(x[r["batch"]], 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=7,
                              transform=ax_ratio.get_xaxis_transform())
    for ax, title in ((ax_tps, "tokens/s (log scale)"), (ax_ratio, f"ratio to {base}")):
        ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    ax_tps.set_yscale("log")
    ax_tps.set_ylim(bottom=min(r["tok_s"] for r in rows if r["tok_s"]) / 2)
    ax_ratio.axhline(1.0, color="black", linewidth=0.8)
    fig.legend(loc="lower center", ncol=len(systems), fontsize=8, frameon=False)
    fig.suptitle("greedy decoding, CPU: measured in one run on one machine", fontsize=10)
    save(fig, path, rect=(0, 0.08, 1, 1))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.max_new_tokens
    args.target_dir = checkpoint_directory(compose_config([f"model={args.model}"])["model"]["path"])
    without_file = GGUF_ONLY & set(args.systems) if gguf_source(args.target_dir) is None else set()
    if without_file:
        sys.exit(f"{', '.join(sorted(without_file))} read a GGUF file; --model {args.model} is not one")
    tok = Tokenizer.from_dir(args.target_dir)
    per_wave = max(b * math.ceil(args.num_prompts / b) for b in args.batch_sizes)
    # each batch size gets prompts of its own: engines persist across batch sizes, and suffix decoding would
    # otherwise draft a later batch size's outputs from an earlier one's
    block = per_wave * (args.rounds + 1)
    try:
        texts = workload_prompts(args.workload, block * len(args.batch_sizes))
        if len(texts) < block * len(args.batch_sizes):
            raise RuntimeError("too few prompts")
        blocks = [texts[i * block:(i + 1) * block] for i in range(len(args.batch_sizes))]
    except RuntimeError:
        texts = workload_prompts(args.workload, block)
        blocks = [texts] * len(args.batch_sizes)
        print(f"workload {args.workload}: too few prompts for a set per batch size; every batch size runs the same "
              "ones (suffix decoding sees them again)")
    if args.workload in CHAT_WORKLOADS:
        blocks = [chat_prompts_for(block_texts, [f"model={args.model}"]) for block_texts in blocks]
    pools = {b: [tok.encode(t) for t in block_texts] for b, block_texts in zip(args.batch_sizes, blocks)}
    print(f"model {args.model}; workload {args.workload}; threads: torch {torch.get_num_threads()}; greedy, "
          f"{n} new tokens per prompt (eos ignored); {args.rounds} timed waves of {args.num_prompts}+ prompts "
          f"per batch size after one warmup batch")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None  # other work skews the systems, not always alike
    if load:
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in load)} on {os.cpu_count()} cpus")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        own_cache = args.graphs_cache is None
        args.graphs_cache = args.graphs_cache or os.path.join(tmp, "graphs")
        starts = measure_starts(args.model, args.graphs_cache, tmp) if args.starts else []
        runners, engines = make_runners(args, [p for b in args.batch_sizes for p in pools[b]], tmp)
        try:
            for b in args.batch_sizes:
                active = {s: fn for s, fn in runners.items() if b == 1 or s not in BATCH1_ONLY}
                lookups = {name: lookup_cost(runner) for name, runner in active.items()}
                chosen = {name: adaptive_cycles(runner) for name, runner in active.items()}
                results[b] = bench_batch(active, make_waves(pools[b], b, args.num_prompts, args.rounds), n)
                print(f"  batch {b}: done")
                for name, runner in active.items():
                    if graphs_state(runner) is not None:
                        print(f"  batch {b}: {SYSTEMS[name]}: graphs {graphs_state(runner)} after its waves")
                for name, before in chosen.items():
                    summary = choice_summary(before, adaptive_cycles(active[name]))
                    if summary:
                        print(f"  batch {b}: {SYSTEMS[name]} chose {summary} of its cycles")
                for name, before in lookups.items():
                    if before is not None:
                        seconds, steps = (after - was for after, was in zip(lookup_cost(active[name]), before))
                        print(f"  batch {b}: {SYSTEMS[name]} lookup and index update {1e6 * seconds / max(steps, 1):.0f} "
                              f"us per step ({steps} steps)")
        finally:
            for eng in engines:
                compiler = eng.graphs.compiler if eng.graphs is not None else None
                if own_cache and compiler is not None and compiler.poll() is None:  # it compiles into this run's directory
                    os.killpg(compiler.pid, signal.SIGTERM)  # its session: inductor's workers and the C++ compiler too
                    compiler.wait()
                eng.close()
    base = SYSTEMS[baseline(args.systems)] if baseline(args.systems) else "-"
    rows = summarize(args, results)
    print("\nRatios were measured in this run, on this machine; they do not transfer to other hardware.")
    print_tables(rows, base)
    for b, res in results.items():
        fixed = {s: res[s][0] for s in FIXED if s in res}
        if "eyas_adaptive" in res and fixed:
            best = max(fixed, key=fixed.get)
            print(f"batch {b}: the default / the fastest fixed configuration ({SYSTEMS[best]}) = "
                  f"{res['eyas_adaptive'][0] / fixed[best]:.2f}x tok/s")
    for b, res in results.items():  # speculation against plain decoding in the same graphs mode
        for default, plain in SPECULATIVE_VS_PLAIN:
            if default in res and plain in res:
                print(f"batch {b}: {SYSTEMS[default]} / {SYSTEMS[plain]} = {res[default][0] / res[plain][0]:.2f}x tok/s")
    pairs = peer_ratios(results)
    for r in pairs:
        print(f"batch {r['batch']}: {r['system']} / {r['peer']} = {r['ratio']:.2f}x tok/s")
    meta = dict(model=args.model, workload=args.workload, threads=torch.get_num_threads(), ct2_threads=args.ct2_threads,
                llama_threads=args.llama_threads, max_new_tokens=n, rounds=args.rounds, num_prompts=args.num_prompts,
                batch_sizes=args.batch_sizes, load_average_at_start=load)
    write_record(args.out, "peers", argv, [scalars(r) for r in rows],
                 {**meta, "rows": rows, "peer_ratios": pairs, "starts": starts})
    if importlib.util.find_spec("matplotlib") is None:
        print("no chart: matplotlib is missing (pip install '.[bench]')")
        return
    plot(rows, base, args.out / "peers.png")
    print(f"wrote {args.out / 'peers.png'}")

if __name__ == "__main__":
    main()
