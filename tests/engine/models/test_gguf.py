"""GGUF files (llama.cpp's format) as `model.path`: tiny random files written as llama.cpp's converter
writes them (tests/support/gguf_fixtures.py) load to the logits and greedy tokens transformers computes from the
same file, tensor by tensor equal to the `gguf` package's dequantization, with the tokenizer and chat
template their metadata describe; broken or foreign files are CheckpointErrors naming model.path."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from support import build_engine
from support.engines import PLAIN
from support.forwards import dense_logits
from support.gguf_fixtures import (BOS, EOS, QTYPES, SHAPE, THETA, hf_model, random_weights, reference_tokenizer,
                                   write_gguf)
from tokenizers import Tokenizer as HFTokenizer

from eyas import SamplingParams
from eyas.engine.chat_template import ModelChatTemplate, model_chat_template
from eyas.engine.errors import CheckpointError
from eyas.engine.models import gguf_file
from eyas.engine.models.checkpoint_source import checkpoint_directory
from eyas.engine.models.gguf_file import GGUFFile
from eyas.engine.models.loader import load_model
from eyas.engine.tokenizer import Tokenizer

gguf = pytest.importorskip("gguf")  # eyas's optional dependency for .gguf files

pytestmark = pytest.mark.usefixtures("cache_root", "one_thread")  # metadata directories in the tests' cache root

# prompts of unequal token lengths: code, digits (merged by the trained BPE), a ChatML turn (special tokens)
PROMPTS = ["def add(a, b):", "x = 12345 + 67890",
           "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n"]
NEW_TOKENS = 16
# texts the tokenizers must agree on: specials, digits, whitespace runs, multi-byte characters
TEXTS = [*PROMPTS, "  two  spaces\t\ttabs\n\n\nlines", "héllo wörld 😀 ÿ", "<|endoftext|>price: 19.99<|im_end|>",
         ""]


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's `LlamaModel.permute` (written independently of gguf_file's)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_order(name: str, w: np.ndarray) -> np.ndarray:
    """A llama file's tensor in Hugging Face's row order."""
    if name.endswith("attn_q.weight"):
        return unpermute(w, SHAPE["heads"])
    if name.endswith("attn_k.weight"):
        return unpermute(w, SHAPE["kv_heads"])
    return w


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_and_greedy_equal_transformers(gguf_model, arch, qtype):
    """Ours and transformers', each reading the file on its own (dequantizing, un-permuting a Llama's
    q / k rows): all-position logits of a few sequences, then greedy tokens through the engine."""
    path = gguf_model(arch, qtype)
    theirs = hf_model(path)
    ours = load_model(path, dtype="float32", weight_layout="linear")
    # qwen2's fixture has no output.weight: the head is the embedding, as transformers ties it
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == (arch == "qwen2")
    vocab = ours.config.vocab_size
    sequences = [[BOS, 5, 17, vocab - 1, 42], list(range(3, vocab, 9))]
    with torch.no_grad():
        for ids in sequences:
            torch.testing.assert_close(dense_logits(ours, ids), theirs(torch.tensor([ids])).logits[0],
                                       atol=1e-4, rtol=1e-4)
    with build_engine([*PLAIN, f"model.path={path}", "prompt=null", "cache=small", "device=cpu", "num_threads=1",
                       "model.weight_layout=linear"]) as eng:
        outs = eng.generate(PROMPTS, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        assert out.prompt_token_ids == reference_tokenizer().encode(prompt).ids  # the file's tokenizer, no bos added
        assert len(set(out.token_ids)) > NEW_TOKENS // 4, "degenerate fixture: greedy output collapsed"
        ids = torch.tensor([out.prompt_token_ids])
        expected = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                   do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert out.token_ids == expected


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "BF16"])
def test_tensor_equals_gguf_dequantize_in_hf_row_order(gguf_model, qtype):
    """Every tensor equals the gguf package's dequantization of the raw data, a Llama's q / k rows
    un-permuted (Q5_0 and BF16 take the package's path, the others eyas's own decoding); a Q4_0 / Q4_1 /
    Q8_0 matrix's blocks decode to the same values, with codes and scales in their documented ranges."""
    path = gguf_model("llama", qtype)
    ours = GGUFFile(path)
    permuted = 0
    for info in gguf.GGUFReader(str(path)).tensors:
        raw = gguf.quants.dequantize(info.data, info.tensor_type)
        expected = torch.from_numpy(hf_order(info.name, raw).copy())
        got = ours.tensor(info.name)
        assert got.dtype == torch.float32 and torch.equal(got, expected), info.name
        permuted += not np.array_equal(raw, expected.numpy())
        if qtype in ("Q4_0", "Q4_1", "Q8_0") and raw.ndim == 2:
            blocks = ours.blocks(info.name)
            out, fan_in = expected.shape
            assert blocks.kind == qtype and blocks.codes.shape == (out, fan_in)
            assert blocks.scale.shape == blocks.offset.shape == (out, fan_in // 32)
            assert torch.equal(blocks.dequantize(), expected), info.name
            low, high = (-128, 127) if qtype == "Q8_0" else (0, 15)
            assert low <= blocks.codes.min() and blocks.codes.max() <= high
            assert torch.equal(blocks.scale.half().float(), blocks.scale)  # the file's float16 values
            if qtype == "Q4_0":
                assert torch.equal(blocks.offset, -8 * blocks.scale)
            if qtype == "Q8_0":
                assert not blocks.offset.any()
    assert permuted == 2 * SHAPE["layers"], "the q / k rows of every layer are stored permuted"


def test_float_tensors_equal_the_weights_written(gguf_model):
    """An F32 file's tensors are the random weights the fixture wrote, in Hugging Face's row order: the
    un-permutation inverts llama.cpp's permutation itself, not only transformers' reading of it."""
    path = gguf_model("llama", "F32")
    ours = GGUFFile(path)
    written = random_weights("llama", ours.hf_config()["vocab_size"], tie=False, seed=0)
    assert set(ours.hf_names().values()) == set(written)
    for name, weights in written.items():
        assert torch.equal(ours.tensor(name), torch.from_numpy(weights)), name
    with pytest.raises(ValueError, match="F32"):
        ours.blocks("blk.0.attn_q.weight")


LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)  # wavelengths past 16 positions stretched


def test_llama3_rope_factors_are_applied_or_refused(gguf_model, tmp_path):
    """A Llama 3.x file carries its rope scaling only as `rope_freqs.weight`: the model computes what
    transformers computes for the checkpoint it was converted from (same weights, the llama3 rope_scaling),
    or it refuses to load the file; it does not run another RoPE."""
    import transformers

    path = write_gguf(tmp_path / "llama3.gguf", "llama", "F32", llama3_rope=LLAMA3_ROPE)
    tensors = GGUFFile(gguf_model("llama", "F32")).tensors()  # the same weights (seed 0), checked above
    config = transformers.LlamaConfig(
        vocab_size=tensors["model.embed_tokens.weight"].shape[0], hidden_size=SHAPE["hidden"],
        intermediate_size=SHAPE["intermediate"], num_hidden_layers=SHAPE["layers"],
        num_attention_heads=SHAPE["heads"], num_key_value_heads=SHAPE["kv_heads"],
        max_position_embeddings=SHAPE["context"], rms_norm_eps=1e-5, rope_theta=THETA["llama"],
        rope_scaling=dict(LLAMA3_ROPE), tie_word_embeddings=False)
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.load_state_dict(tensors)
    try:
        ours = load_model(path, dtype="float32", weight_layout="linear")
    except CheckpointError as e:
        assert "rope_freqs" in str(e)
        return
    ids = list(range(3, ours.config.vocab_size, 6))  # 60 positions
    with torch.no_grad():
        torch.testing.assert_close(dense_logits(ours, ids), reference(torch.tensor([ids])).logits[0],
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pre", ["default", "smollm"])
def test_tokenizer_equals_the_one_it_was_made_from(gguf_model, pre):
    """tokenizer.json built from the metadata encodes and decodes as the Hugging Face tokenizer the
    file's vocabulary, merges and pre-tokenizer name stand for; special tokens are single tokens, eos
    is the file's."""
    directory = checkpoint_directory(gguf_model("llama", "F32", pre))
    ours = Tokenizer.from_dir(directory)
    raw = HFTokenizer.from_file(str(directory / "tokenizer.json"))  # eyas's decode drops special tokens
    ref = reference_tokenizer(pre)
    assert ours.eos_token_ids == (EOS,) and ours.vocab_size == ref.get_vocab_size()
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text).ids, text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
        assert raw.decode(ids, skip_special_tokens=False) == text, text
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert ours.encode(special) == [ref.token_to_id(special)]


def test_smollm_pre_tokenizer_splits_digits(gguf_model):
    """The same vocabulary and merges (which join digits) under pre "smollm": one token per digit."""
    default = Tokenizer.from_dir(checkpoint_directory(gguf_model("llama", "F32", "default")))
    smollm = Tokenizer.from_dir(checkpoint_directory(gguf_model("llama", "F32", "smollm")))
    text = "x = 12345 + 67890"
    assert " 12345" in [default.token_text(i) for i in default.encode(text)]  # the merges do join them
    pieces = [smollm.token_text(i) for i in smollm.encode(text)]
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("1234567890")


def test_unknown_pre_tokenizer_is_an_error(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "llama", "F32", pre="mystery-bpe")
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.pre 'mystery-bpe' is not supported") as e:
        load_model(path)
    assert "model.path" in str(e.value)
    assert all(repr(name) in str(e.value) for name in ("default", "smollm", "llama-bpe", "qwen2"))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chat_template_renders_as_transformers(gguf_model, arch):
    """The file's tokenizer.chat_template, read from the metadata directory, renders as transformers'
    apply_chat_template of the tokenizer it reads from the same file (with and without a system turn)."""
    from transformers import AutoTokenizer

    path = gguf_model(arch, "Q8_0")
    ours = model_chat_template(checkpoint_directory(path))
    assert isinstance(ours, ModelChatTemplate)
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for messages in ([("user", "Hello!"), ("assistant", "Hi."), ("user", "What is 2+2?")],
                     [("system", "Be brief."), ("user", "x = 12345")]):
        expected = theirs.apply_chat_template([{"role": r, "content": c} for r, c in messages], tokenize=False,
                                              add_generation_prompt=True)
        assert expected.startswith("<|im_start|>system\n") and expected.endswith("<|im_start|>assistant\n")
        assert ours.render(messages) == expected


def truncated_copy(source, target):
    data = source.read_bytes()
    target.write_bytes(data[:len(data) // 2])
    return target


@pytest.mark.parametrize("arch,qtype,pre", [("llama", "Q4_1", "smollm"), ("qwen2", "F16", "default"),
                                            ("llama", "Q5_0", "default"), ("llama", "BF16", "default")])
def test_header_reads_as_the_gguf_packages_reader_reads_it(gguf_model, arch, qtype, pre):
    """eyas reads the header itself (the package's reader builds a view per tokenizer string: seconds per start):
    every metadata value as the package's `contents()`, every tensor's type, offset, size and data view alike."""
    ours = GGUFFile(gguf_model(arch, qtype, pre))
    theirs = gguf.GGUFReader(str(ours.path))
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert fields and all(ours.field(k) == v for k, v in fields.items()), \
        [k for k, v in fields.items() if ours.field(k) != v]
    assert ours.field("tokenizer.ggml.tokens") and ours.field("no.such.key", 7) == 7
    assert len(ours._tensors) == len(theirs.tensors)
    for info in theirs.tensors:
        mine = ours._tensors[info.name]
        assert (mine.tensor_type, mine.data_offset, mine.n_bytes) == (info.tensor_type, info.data_offset, info.n_bytes)
        assert mine.data.dtype == info.data.dtype and mine.data.shape == info.data.shape
        assert np.array_equal(mine.data, info.data), info.name


def test_a_foreign_or_cut_header_is_an_error_naming_the_field(gguf_model, tmp_path):
    data = gguf_model("llama", "Q8_0").read_bytes()
    for name, content in (("foreign.gguf", b"PK\x03\x04" + data[4:]), ("header.gguf", data[:200])):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError, match="model.path: cannot read .* as GGUF"):
            GGUFFile(tmp_path / name)


def test_truncated_file_is_an_error(gguf_model, tmp_path):
    path = truncated_copy(gguf_model("qwen2", "Q4_1"), tmp_path / "half.gguf")
    with pytest.raises(CheckpointError, match="model.path") as e:
        load_model(path)
    assert str(path) in str(e.value) and "truncated" in str(e.value)


def test_unsupported_architecture_is_an_error(tmp_path):
    path = write_gguf(tmp_path / "falcon.gguf", "falcon", "F32")
    with pytest.raises(CheckpointError, match="model.path: .* holds a 'falcon' model; supported GGUF architectures") \
            as e:
        load_model(path)
    assert "'llama'" in str(e.value) and "'qwen2'" in str(e.value)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="model.path: GGUF file not found: .*missing.gguf"):
        load_model(tmp_path / "missing.gguf")


def test_cli_names_model_path_for_a_truncated_file(gguf_model, tmp_path):
    """As a user runs it: a message naming model.path, a non-zero exit, no traceback."""
    path = truncated_copy(gguf_model("llama", "Q4_0"), tmp_path / "half.gguf")
    proc = subprocess.run([sys.executable, "-m", "eyas", f"model.path={path}", "speculative=none"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    printed = " ".join((proc.stderr + proc.stdout).split())  # the console wraps long lines
    assert proc.returncode != 0
    assert "model.path" in printed and "truncated" in printed
    assert "Traceback" not in printed


def test_metadata_directory_is_reused_until_the_file_changes(tmp_path, monkeypatch):
    """Built once per (path, size, mtime): a second call reads nothing from the file; a rewritten file
    (another size) or a touched one (another mtime) gets a directory of its own, built from it."""
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "m.gguf", "qwen2", "Q8_0")
    first = checkpoint_directory(path)
    assert first.parent == tmp_path / "cache" / "gguf"
    built = {f.name: f.stat().st_mtime_ns for f in first.iterdir()}
    assert set(built) == {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                          "gguf.json"}
    config = json.loads((first / "config.json").read_text())
    assert (config["model_type"], config["num_key_value_heads"], config["tie_word_embeddings"]) == \
        ("qwen2", SHAPE["kv_heads"], True)

    def unread(*args, **kwargs):
        raise AssertionError("the file was read again")

    with monkeypatch.context() as m:
        m.setattr(gguf_file.GGUFFile, "__init__", unread)
        assert checkpoint_directory(path) == first
    assert {f.name: f.stat().st_mtime_ns for f in first.iterdir()} == built

    stat = path.stat()
    write_gguf(path, "llama", "F16")  # another model, another size
    assert path.stat().st_size != stat.st_size
    second = checkpoint_directory(path)
    assert second != first and json.loads((second / "config.json").read_text())["model_type"] == "llama"
    os.utime(path, ns=(stat.st_atime_ns, path.stat().st_mtime_ns + 10**9))  # same bytes, another mtime
    third = checkpoint_directory(path)
    assert third not in (first, second) and (third / "gguf.json").is_file()
    # three whole directories, no staging one left behind
    assert sorted(p.name for p in third.parent.iterdir()) == sorted(d.name for d in (first, second, third))
