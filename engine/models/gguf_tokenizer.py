"""A GGUF file's tokenizer metadata as the Hugging Face files `tokenizers` and the chat template read:
`tokenizer.json` (byte-level BPE: vocabulary, merges, the pre-tokenizer its `tokenizer.ggml.pre` names,
special tokens) and `tokenizer_config.json` (bos / eos and the chat template).
"""

from eyas.engine.errors import CheckpointError

BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(pattern: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {**BYTE_LEVEL, "use_regex": False}]}


# tokenizer.ggml.pre -> the pre-tokenizer of the Hugging Face tokenizer it was converted from
PRE_TOKENIZERS = {
    "default": BYTE_LEVEL,
    "gpt-2": BYTE_LEVEL,
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "starcoder": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "llama-bpe": _split_then_bytes(LLAMA3_SPLIT),
    "qwen2": _split_then_bytes(QWEN2_SPLIT),
}
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special tokens


def tokenizer_json(gguf) -> dict:
    """`tokenizer.json` for a GGUFFile whose tokenizer is byte-level BPE (`tokenizer.ggml.model = gpt2`)."""
    model = gguf.field("tokenizer.ggml.model")
    if model != "gpt2":
        raise CheckpointError(f"model.path: {gguf.path}: tokenizer.ggml.model {model!r} is not supported; "
                              f"allowed: ['gpt2'] (byte-level BPE)")
    pre = gguf.field("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"model.path: {gguf.path}: tokenizer.ggml.pre {pre!r} is not supported; "
                              f"allowed: {sorted(PRE_TOKENIZERS)}")
    tokens = gguf.field("tokenizer.ggml.tokens")
    merges = gguf.field("tokenizer.ggml.merges") or []
    types = gguf.field("tokenizer.ggml.token_type") or [1] * len(tokens)
    special = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
    bos = gguf.field("tokenizer.ggml.bos_token_id")
    add_bos = bool(gguf.field("tokenizer.ggml.add_bos_token", False)) and bos is not None
    if add_bos:
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": tokens[bos], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": tokens[bos], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": tokens[bos], "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {tokens[bos]: {"id": tokens[bos], "ids": [bos], "tokens": [tokens[bos]]}}}
    else:
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre], "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {token: i for i, token in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }


def tokenizer_config(gguf) -> dict:
    """`tokenizer_config.json`: special tokens by name and the chat template (when the file has one)."""
    tokens = gguf.field("tokenizer.ggml.tokens")
    config = {"add_bos_token": bool(gguf.field("tokenizer.ggml.add_bos_token", False))}
    for key in ("bos", "eos", "unknown", "padding"):
        index = gguf.field(f"tokenizer.ggml.{key}_token_id")
        if index is not None and 0 <= index < len(tokens):
            config[{"unknown": "unk_token", "padding": "pad_token"}.get(key, f"{key}_token")] = tokens[index]
    template = gguf.field("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config
