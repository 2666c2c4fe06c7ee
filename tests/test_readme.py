"""Every command in the README's code blocks, run through a shell as written, so the documentation and
the code cannot drift apart.

Stand-ins for what a reader brings:
- `/ckpt/llama`, `/ckpt/eagle3-head`: a tiny target and its trained EAGLE-3 head (fixtures);
- `prompts.txt`, `prompts.jsonl`: files in the working directory;
- `HEAD:6379`: a Ray head node this test starts (without Ray's token authentication), and stops afterwards;
- `multirun/DATE/TIME`: the newest multirun directory whose jobs ran;
- `127.0.0.1:PORT`: a free port in place of the README's; `python -m eyas.launch.serve` starts in the
  background, must answer `/v1/models` with its model, and stops at the end of the module (the
  python blocks that speak to it run while it is up).

Changes to the commands: `sampling.max_new_tokens=2` is appended to each `python -m eyas` command, so
each generates briefly; `pip install` runs with `--dry-run` (it resolves what it would install and
changes nothing); a `slurm` launcher submits to a stand-in `sbatch` on PATH that keeps the submission
script and refuses it (there is no cluster here), and the script is checked; `python -m pytest` is
this suite itself: `.ci/run` must run that command line as written instead.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TINY = "sampling.max_new_tokens=2"
FAKE_SBATCH = """#!/bin/sh
# keeps the submission script (the last argument) and refuses it: there is no SLURM cluster here
for last in "$@"; do :; done
cp "$last" "$RECORD_DIR/submission.sh"
echo "no SLURM cluster here" >&2
exit 1
"""


def readme_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), flags=re.S)


def bash_commands() -> list[str]:
    return [line.strip() for block in readme_blocks("bash") for line in block.splitlines() if line.strip()]


def segments(command: str) -> list[list[str]]:
    """`a && b # comment` -> [[a...], [b...]] (shell words, comments dropped)."""
    words = shlex.split(command, comments=True)
    out = [[]]
    for word in words:
        if word == "&&":
            out.append([])
        else:
            out[-1].append(word)
    return out


class Workspace:
    """The working directory the commands share, with the stand-ins they name."""

    def __init__(self, path: Path, target: Path, head: Path):
        self.path, self.target, self.head = path, target, head
        (path / "prompts.txt").write_text("def add(a, b):\nimport os\n")
        (path / "prompts.jsonl").write_text('{"prompt": "class Point:"}\n{"prompt": "for i in"}\n')
        self.ray_address: str | None = None
        self.servers: dict[str, ServerProcess] = {}  # the README's port -> the server standing in
        self.ray_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths have a length limit

    def substitute(self, word: str) -> str:
        word = word.replace("/ckpt/llama", str(self.target)).replace("/ckpt/eagle3-head", str(self.head))
        if "HEAD:6379" in word:
            word = word.replace("HEAD:6379", self.start_ray())
        if word == "multirun/DATE/TIME":
            word = str(self.newest_multirun())
        return word

    def newest_multirun(self) -> Path:
        """The newest sweep whose jobs ran (the SLURM one never does here)."""
        def ran():
            return sorted(d for d in self.path.glob("multirun/*/*") if any(d.rglob("outputs.json")))

        if not ran():  # run alone (pytest -k): make one to report on
            self.run(["python", "-m", "eyas", "-m", "speculative.num_steps=1,2", TINY])
        return ran()[-1]

    def start_ray(self) -> str:
        if self.ray_address is None:
            port = 6400 + (abs(hash(str(self.path))) % 500)
            done = self.run(["ray", "start", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={self.ray_dir}",
                             "--disable-usage-stats", "--include-dashboard=false"], env=_env())
            assert done.returncode == 0, done.stdout + done.stderr
            self.ray_address = f"127.0.0.1:{port}"
        return self.ray_address

    def start_server(self, readme_port: str, overrides: list[str]) -> ServerProcess:
        if readme_port not in self.servers:
            self.servers[readme_port] = ServerProcess(*overrides, cwd=self.path, as_written=True)
        return self.servers[readme_port]

    def substitute_ports(self, code: str) -> str:
        """`127.0.0.1:8000` in client code -> the port of the server standing in (started if need be)."""
        for readme_port in set(re.findall(r"127\.0\.0\.1:(\d+)", code)):
            server = self.start_server(readme_port, [])
            code = code.replace(f"127.0.0.1:{readme_port}", f"127.0.0.1:{server.port}")
        return code

    def stop_servers(self) -> None:
        for server in self.servers.values():
            server.stop()

    def stop_ray(self) -> None:
        if self.ray_address is not None:
            subprocess.run(["ray", "stop", "--force"], capture_output=True, timeout=120, env=_env())
        shutil.rmtree(self.ray_dir, ignore_errors=True)

    def run(self, words: list[str], cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(shlex.join(words), shell=True, executable="/bin/bash", cwd=cwd or self.path,
                              env=env, capture_output=True, text=True, timeout=600)
        return done


@pytest.fixture(scope="module")
def workspace(spec_pair, tmp_path_factory):
    target, heads = spec_pair
    space = Workspace(tmp_path_factory.mktemp("readme"), target, heads["eagle3"])
    yield space
    space.stop_ray()
    space.stop_servers()


def _env(**extra) -> dict:
    # the test's Ray head runs without Ray's token authentication, and so do the drivers that join it
    return {**os.environ, "HYDRA_FULL_ERROR": "1", "RAY_AUTH_MODE": "disabled", **extra}


def run_segment(space: Workspace, words: list[str]) -> None:
    words = [space.substitute(w) for w in words]
    if words[:2] == ["pip", "install"]:
        done = space.run([sys.executable, "-m", "pip", "install", "--dry-run", "-q", *words[2:]], cwd=ROOT)
    elif words[:3] == ["python", "-m", "pytest"]:
        return  # this suite: test_ci_runs_the_readme_test_command
    elif words[:3] == ["python", "-m", "eyas"] and "hydra/launcher=slurm" in words:
        bin_dir = space.path / "fake_slurm"
        bin_dir.mkdir(exist_ok=True)
        for name, text in (("sbatch", FAKE_SBATCH), ("srun", "#!/bin/sh\nexit 1\n")):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        done = space.run([*words, TINY], env=_env(PATH=f"{bin_dir}:{_env()['PATH']}", RECORD_DIR=str(bin_dir)))
        assert done.returncode != 0 and "no SLURM cluster here" in done.stdout + done.stderr, done.stdout + done.stderr
        script = (bin_dir / "submission.sh").read_text()
        partition = next(w.split("=", 1)[1] for w in words if w.startswith("hydra.launcher.partition="))
        jobs = next(len(w.split("=", 1)[1].split(",")) for w in words if w.startswith("speculative.num_steps="))
        for line in (f"#SBATCH --partition={partition}", f"#SBATCH --array=0-{jobs - 1}", "#SBATCH --job-name=eyas",
                     "#SBATCH --cpus-per-task=8", "submitit.core._submit"):
            assert line in script, f"{line!r} not in the submission script:\n{script}"
        return
    elif words[:3] == ["python", "-m", "eyas"]:
        done = space.run([*words, TINY], env=_env())
    elif words[:3] == ["python", "-m", "eyas.launch.serve"]:
        readme_port = next(w.split("=", 1)[1] for w in words if w.startswith("server.port="))
        server = space.start_server(readme_port, [w for w in words[3:] if not w.startswith("server.port=")])
        status, models = server.get("/v1/models")
        name = next((w.split("=", 1)[1] for w in words if w.startswith("server.served_model_name=")),
                    "target" if "model=tiny" in words else "smollm2")  # the model directory's name
        assert status == 200 and f'"id":"{name}"' in models, models
        return
    elif words[:1] == ["eyas-serve"] and "replicas=ray" in words:  # each its own local Ray cluster, stopped after
        server = ServerProcess(*words[1:], cwd=space.path, as_written=True, startup_s=600)
        try:
            status, models = server.get("/v1/models")
            health = json.loads(server.get("/health")[1])
        finally:
            server.stop()
        replicas = next((int(w.split("=", 1)[1]) for w in words if w.startswith("replicas.num_replicas=")), 2)
        name = "target" if "model=tiny" in words else "smollm2"
        assert status == 200 and f'"id":"{name}"' in models and health["replicas"] == replicas, (models, health)
        assert server.proc.returncode == 0
        return
    elif words[:3] == ["python", "-m", "eyas.engine.report"]:
        done = space.run(words, env=_env())
        assert "wrote" in done.stdout and (Path(words[3]) / "report.md").is_file(), done.stdout + done.stderr
    else:
        pytest.fail(f"no rule for README command {shlex.join(words)!r}: add one to {Path(__file__).name}")
    assert done.returncode == 0, f"{shlex.join(words)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


# Commands run under -m slow: variants of a kind the default run covers with another command (the default
# model's other runs, a prompts file, drafters
# past n-gram, trees, adaptive tiers, sweeps but joblib's, searches, the other launchers, the extras'
# installs). tests/launch/test_cli.py and tests/launch/test_sweeps.py check sweeps, the adaptive policies and a
# search by default.
SLOW_COMMANDS = ("prompt='What is a Python decorator?'", "adaptive=off speculative.num_steps=2 ",
                 "prompts_file=prompts.txt  ", "# its EAGLE-1 head", "# the EAGLE-3 head and prompt lookup", "# suffix decoding:",
                 "-m adaptive=off speculative.num_steps=1,3,5", "# chain, up to 5 tokens", "speculative.topk=", "speculative=standalone", "# k = 4, ngram_trust",
                 "adaptive.tiers=", "-m sampling.temperature=", "-m adaptive=off,ema,throughput", "experiment=",
                 "hydra/sweeper=", "hydra/launcher=ray", "hydra/launcher=slurm", "pip install '.[sweep]'",
                 "pip install '.[serve]'", "replicas=ray", "pip install '.[ray]'")


def readme_command_params() -> list:
    return [pytest.param(c, marks=[pytest.mark.slow] if any(n in c for n in SLOW_COMMANDS) else [], id=c)
            for c in bash_commands()]


@pytest.mark.parametrize("command", readme_command_params())
def test_readme_command(workspace, command):
    for words in segments(command):
        run_segment(workspace, words)


def test_ci_runs_the_readme_test_command():
    tests = [c for c in bash_commands() if "python -m pytest" in c]
    assert len(tests) == 1, tests
    ci = [line.strip() for line in ROOT.joinpath(".ci/run").read_text().splitlines()]
    assert tests[0] in ci, f".ci/run must run the README's test command as written: {tests[0]}"


@pytest.mark.parametrize("index", range(len(readme_blocks("python"))))
def test_readme_python_block(workspace, index):
    code = readme_blocks("python")[index]
    script = workspace.path / f"readme_block_{index}.py"
    code = workspace.substitute_ports(code)
    script.write_text(code.replace("/ckpt/llama", str(workspace.target)).replace("/ckpt/eagle3-head", str(workspace.head)))
    done = workspace.run(["python", str(script)], env=_env())
    assert done.returncode == 0, f"{code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_readme_has_commands_of_every_kind():
    commands = bash_commands()
    assert len(commands) >= 15 and readme_blocks("python")
    for needle in ("python -m pytest", "experiment=tune_speculative", "hydra/launcher=ray", "hydra/launcher=slurm",
                   "python -m eyas.engine.report", "prompts_file=", "python -m eyas.launch.serve"):
        assert any(needle in c for c in commands), needle
