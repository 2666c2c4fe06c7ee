"""Tiny random GGUF files written with ggml-org's `gguf` package as llama.cpp's converter writes them
(`convert_hf_to_gguf.py`): llama.cpp's tensor names, its metadata keys, a Llama's q / k rows permuted for
its RoPE, byte-level BPE tokenizer fields, a ChatML chat template. The reference they are checked against
is transformers loading the same file (`from_pretrained(..., gguf_file=...)`), which decodes and
un-permutes them on its own (with the `gguf` package's dequantization)."""

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from support.checkpoints import fixture_dir

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (trained first)
BOS, EOS = 1, 2  # as SmolLM2-Instruct's file: <|im_start|>, <|im_end|>
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\nprint(os.getcwd())\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    # numbers, so that the trained merges join digits: the "smollm" pre-tokenizer must split them again
    "x = 12345 + 67890\ny = 2024 * 1000\nprice: 19.99, 42, 100, 256, 1024\n" * 2,
    "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\nHi, how can I help?<|im_end|>\n",
]
# ChatML with a default system turn (SmolLM2-Instruct's shape): block tags on their own lines, so the
# output depends on trim_blocks / lstrip_blocks as transformers renders it
CHAT_TEMPLATE = (
    "{% for message in messages %}\n"
    "    {% if loop.first and messages[0]['role'] != 'system' %}\n"
    "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
    "    {% endif %}\n"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "<|im_start|>assistant\n"
    "{% endif %}"
)
# the tokenizer.ggml.pre values written here -> the pre-tokenizer of the Hugging Face tokenizer they stand for
PRE = {"default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
       "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False)])}
QTYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
EXTRA_QTYPES = ("BF16", "Q5_0")  # read through the gguf package's dequantization (checked tensor by tensor)
# llama.cpp's general.file_type of a file whose matrices are all of one type (LlamaFileType)
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "BF16": 32}
THETA = {"llama": 10000.0, "qwen2": 1000000.0}  # rope.freq_base
# hidden and intermediate widths multiples of 32 (the Q types' block), GQA, head_dim 16
SHAPE = dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, context=256)


@functools.cache
def trained_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on CORPUS (whose merges join digits); the vocabulary and merges every
    fixture's file holds. Shared: do not modify it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = PRE["default"]()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def reference_tokenizer(pre: str = "default") -> Tokenizer:
    """The Hugging Face tokenizer a file with `tokenizer.ggml.pre = pre` stands for: the trained
    vocabulary and merges behind the pre-tokenizer `pre` names."""
    tok = Tokenizer.from_str(trained_tokenizer().to_str())
    tok.pre_tokenizer = PRE[pre]()
    return tok


def tokenizer_fields(tok: Tokenizer) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types, merges as "a b") as llama.cpp's converter writes a gpt2 vocabulary."""
    model = json.loads(tok.to_str())["model"]
    tokens = [None] * len(model["vocab"])
    for token, index in model["vocab"].items():
        tokens[index] = token
    types = [3 if t in SPECIAL_TOKENS else 1 for t in tokens]  # CONTROL, NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py): each head's rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_weights(arch: str, vocab: int, tie: bool, seed: int, std: float = 0.25) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array in Hugging Face's row order (not yet permuted), [out, in] as numpy
    holds it (GGUF lists the dimensions reversed). Wide init keeps greedy output varied; norms away from 1
    and qwen2's q/k/v biases make their loading matter."""
    s = SHAPE
    g = torch.Generator().manual_seed(seed)
    head_dim = s["hidden"] // s["heads"]

    def rand(*shape, mean=0.0, scale=std):
        return (torch.randn(*shape, generator=g) * scale + mean).numpy()

    tensors = {"token_embd.weight": rand(vocab, s["hidden"], scale=1.0),
               "output_norm.weight": rand(s["hidden"], mean=1.0, scale=0.1)}
    if not tie:
        tensors["output.weight"] = rand(vocab, s["hidden"], scale=0.5)
    for i in range(s["layers"]):
        p = f"blk.{i}"
        tensors.update({
            f"{p}.attn_norm.weight": rand(s["hidden"], mean=1.0, scale=0.1),
            f"{p}.ffn_norm.weight": rand(s["hidden"], mean=1.0, scale=0.1),
            f"{p}.attn_q.weight": rand(s["heads"] * head_dim, s["hidden"]),
            f"{p}.attn_k.weight": rand(s["kv_heads"] * head_dim, s["hidden"]),
            f"{p}.attn_v.weight": rand(s["kv_heads"] * head_dim, s["hidden"]),
            f"{p}.attn_output.weight": rand(s["hidden"], s["heads"] * head_dim),
            f"{p}.ffn_gate.weight": rand(s["intermediate"], s["hidden"]),
            f"{p}.ffn_up.weight": rand(s["intermediate"], s["hidden"]),
            f"{p}.ffn_down.weight": rand(s["hidden"], s["intermediate"]),
        })
        if arch == "qwen2":
            for kind, rows in (("q", s["heads"]), ("k", s["kv_heads"]), ("v", s["kv_heads"])):
                tensors[f"{p}.attn_{kind}.bias"] = rand(rows * head_dim)
    return tensors


def llama3_rope_factors(rope_scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """`rope_freqs.weight`, which llama.cpp's converter writes for a Llama 3 `rope_scaling` in place of any
    metadata (convert_hf_to_gguf.py, `LlamaModel.generate_extra_tensors`): per rotary frequency, the
    factor its wavelength is stretched by."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope_scaling["factor"], rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
    old_context = rope_scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            factors.append(1)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(path: Path, arch: str = "llama", qtype: str = "F32", *, pre: str = "default", tie: bool | None = None,
               seed: int = 0, chat_template: str | None = CHAT_TEMPLATE, llama3_rope: dict | None = None) -> Path:
    """A random `arch` model ("llama": q / k rows permuted, an `output.weight`; "qwen2": q / k / v biases,
    tied embeddings; any other name: llama's tensors under that architecture) whose matrices are of GGML
    type `qtype` (one of QTYPES or EXTRA_QTYPES; norms and biases F32), with the trained tokenizer's
    vocabulary and merges and `tokenizer.ggml.pre = pre` (any string: unknown ones are for the errors).
    `llama3_rope`: a Hugging Face Llama 3 `rope_scaling`, written as llama.cpp does (`rope_freqs.weight`)."""
    import gguf

    s = SHAPE
    tie = arch == "qwen2" if tie is None else tie
    tokens, types, merges = tokenizer_fields(trained_tokenizer())
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}-{qtype}")
    writer.add_block_count(s["layers"])
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_feed_forward_length(s["intermediate"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_freq_base(THETA.get(arch, THETA["llama"]))
    writer.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    writer.add_vocab_size(len(tokens))
    if arch == "llama":
        writer.add_rope_dimension_count(s["hidden"] // s["heads"])
    writer.add_file_type(FILE_TYPES[qtype])
    if qtype.startswith("Q"):  # as the converter marks a quantized file
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    if llama3_rope is not None:
        writer.add_tensor("rope_freqs.weight",
                          llama3_rope_factors(llama3_rope, THETA.get(arch, THETA["llama"]), s["hidden"] // s["heads"]))
    for name, data in random_weights(arch, len(tokens), tie, seed).items():
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            data = permute(data, s["heads"] if "attn_q" in name else s["kv_heads"])
        if data.ndim == 1 or qtype == "F32":
            writer.add_tensor(name, data)
        elif qtype == "F16":
            writer.add_tensor(name, data.astype(np.float16))
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_model(path: Path):
    """transformers' model read from the GGUF file itself (dequantized and un-permuted by transformers),
    float32, never stopping at eos (full lengths compared)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("eyas-gguf-cache")


@pytest.fixture
def cache_root(gguf_cache, monkeypatch):
    """Metadata directories are built in a cache root of the tests', never in the user's (the modules that
    read GGUF files use it for every test: `pytestmark = pytest.mark.usefixtures("cache_root")`)."""
    monkeypatch.setenv("EYAS_CACHE_DIR", str(gguf_cache))


@pytest.fixture(scope="session")
def gguf_model(tmp_path_factory):
    """gguf_model(arch, qtype, pre="default") -> a fixture file, written once per session."""
    def get(arch: str, qtype: str, pre: str = "default"):
        name = f"gguf-{arch}-{qtype}-{pre}"
        return fixture_dir(tmp_path_factory, name, lambda d: write_gguf(d / f"{name}.gguf", arch, qtype, pre=pre)) \
            / f"{name}.gguf"

    return get


@pytest.fixture(scope="module")
def one_thread():
    """The tiny models run on one CPU thread (a second one only waits on the first at these shapes, and
    seconds per test where the cores are busy; the count is restored for the modules after this one: `usefixtures("one_thread")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
