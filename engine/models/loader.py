"""Load a Hugging Face decoder directory (Llama, Mistral, Qwen2, Qwen3): config.json, (sharded) safetensors."""

import contextlib
import contextvars
import functools
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from eyas.engine.errors import CheckpointError, ConfigError
from eyas.engine.models import gguf_block_weights
from eyas.engine.models.checkpoint_source import checkpoint_directory, gguf_source
from eyas.engine.models.config import DTYPES, ModelConfig, load_model_config, read_json
from eyas.engine.models.layout_choice import choose_layouts
from eyas.engine.models.llama import LlamaForCausalLM
from eyas.engine.models.weight_formats import (GGUF_SCHEMES, Quantization, check_int4_shapes, check_quantization,
                                               resolve_quantization)

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


_SKIP_INIT = contextvars.ContextVar("skip_init", default=False)


@contextlib.contextmanager
def meta_device():
    """Modules built in here hold meta tensors, left uninitialised: the checkpoint's tensors are assigned
    next. (Initialising a meta tensor runs torch's reference ops, whose first call imports Dynamo: a
    second of every start.) Only this context's own thread skips the initialisation."""
    _skip_init_where_asked()
    token = _SKIP_INIT.set(True)
    try:
        with torch.device("meta"):
            yield
    finally:
        _SKIP_INIT.reset(token)


@functools.cache
def _skip_init_where_asked() -> None:
    """Make nn.Linear's and nn.Embedding's initialisation a no-op inside `meta_device` (once per process)."""
    for cls in (nn.Linear, nn.Embedding):
        def reset_parameters(module, original=cls.reset_parameters):
            if not _SKIP_INIT.get():
                original(module)
        cls.reset_parameters = reset_parameters


def checkpoint_dir(path: str | Path) -> Path:
    return checkpoint_directory(path)


def safetensors_files(directory: Path, allow_bin: bool = False) -> list[Path]:
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if allow_bin and (directory / "pytorch_model.bin").is_file():
        return [directory / "pytorch_model.bin"]
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        if not shards:
            raise CheckpointError(f"{index}: empty weight_map")
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{index}: missing shard files {missing} in {directory}")
        return [directory / s for s in shards]
    raise CheckpointError(f"missing file: neither {single.name} nor {index.name} in {directory}")


def gguf_file_of(directory: Path):
    """The GGUFFile a metadata directory stands for (None for a Hugging Face directory)."""
    source = gguf_source(directory)
    if source is None:
        return None
    from eyas.engine.models.gguf_file import GGUFFile  # needs the `gguf` package

    return GGUFFile(source)


def read_tensors(directory: Path, allow_bin: bool = False, gguf_file=None) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (`pytorch_model.bin` too when `allow_bin`: draft heads ship so;
    a GGUF file's metadata directory: the file's tensors, dequantized to float32, read from `gguf_file`
    when the caller opened it)."""
    gguf_file = gguf_file or gguf_file_of(directory)
    if gguf_file is not None:
        return gguf_file.tensors()
    tensors = {}
    for file in safetensors_files(directory, allow_bin):
        if file.suffix == ".bin":
            try:
                return dict(torch.load(file, map_location="cpu", weights_only=True))
            except Exception as e:  # pickle errors have no common base class
                raise CheckpointError(f"cannot read {file}: {e}") from e
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:
            raise CheckpointError(f"cannot read {file}: {e} (a truncated download, or not a safetensors file?)") from e
    return tensors


def resolve_dtype(name: str, config_dtype: str) -> torch.dtype:
    if name == "auto":
        return DTYPES[config_dtype]
    return DTYPES[name]


def assign_state(module: torch.nn.Module, tensors: dict, dtype: torch.dtype, device: torch.device, source: str,
                 ignored: tuple[str, ...] = ()):
    """Check names and shapes against `module` (built on meta), then assign the tensors in place.
    Integer and bool tensors keep their dtype."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise CheckpointError(f"{source}: missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    unexpected = [k for k in tensors if k not in expected and not k.endswith(IGNORED_SUFFIXES) and k not in ignored]
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensors {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    state = {}
    for name, ref in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(ref.shape)}"
            )
        if tensor.is_floating_point() != ref.is_floating_point() or (tensor.dtype == torch.bool) != (ref.dtype == torch.bool):
            kind = "a floating-point" if ref.is_floating_point() else ("a bool" if ref.dtype == torch.bool else "an integer")
            raise CheckpointError(f"{source}: tensor {name!r} has dtype {tensor.dtype}, expected {kind} dtype")
        state[name] = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else tensor.dtype)
    module.load_state_dict(state, assign=True)


def pack_for_inference(model: torch.nn.Module, weight_layout: str, device: torch.device,
                       quantization: Quantization | None = None, field: str = "model",
                       runs_beside: torch.nn.Module | None = None) -> None:
    """Fuse the model's projections in the layout `weight_layout` names (`auto`: timed here), or store
    them quantized (`quantization`, checked against the model's shapes; `field` names its config).
    `runs_beside`: the model whose forwards alternate with this one's (a draft's target): the layouts
    are timed with both models' bytes in play."""
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    shapes = model.projection_shapes()
    if quantization is None or quantization.scheme == "none":
        model_bytes = sum(matrix_bytes(m) for m in (model, runs_beside) if m is not None)
        return model.pack(choose_layouts(shapes, weight_layout, dtype, device, model_bytes))
    check_quantization(quantization.scheme, quantization.group_size, device, field)
    if quantization.scheme == "q8_0":  # rounded here into the blocks a file's Q8_0 holds, then run as gguf's
        gguf_block_weights.attach_rounded_q8_0(model)
        quantization = Quantization("gguf")
    if quantization.scheme in GGUF_SCHEMES:  # the file's blocks where they are stored so, else the float layouts
        model_bytes = sum(matrix_bytes(m) for m in (model, runs_beside) if m is not None)
        fallback = choose_layouts(shapes, weight_layout, dtype, device, model_bytes)
        return model.pack({name: Quantization(quantization.scheme, fallback=layout) for name, layout in fallback.items()})
    if quantization.scheme == "int4":
        check_int4_shapes(shapes, quantization.group_size, field)
    model.pack(dict.fromkeys(shapes, quantization))


def attach_gguf_blocks(model: LlamaForCausalLM, directory: Path, scheme: str, field: str, gguf_file=None) -> None:
    """Hand each projection its GGUF file blocks (Q4_0 / Q4_1 / Q8_0) for `pack` (gguf_block_weights); a tied
    lm_head gets the embedding's."""
    gguf_file = gguf_file or gguf_file_of(directory)
    if gguf_file is None:
        raise ConfigError(f"{field}.quantization={scheme} keeps a GGUF file's quantized blocks, but {field}.path is "
                          f"not a .gguf file ({directory}); allowed here: none, int8, int4")
    blocks = gguf_file.quantized_blocks()
    if model.lm_head.weight is model.model.embed_tokens.weight and "model.embed_tokens.weight" in blocks:
        blocks["lm_head.weight"] = blocks["model.embed_tokens.weight"]
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and f"{name}.weight" in blocks:
            gguf_block_weights.attach(module, blocks[f"{name}.weight"])


def matrix_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weight matrices (projections and embeddings; meta ones counted as loaded)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.dim() == 2 and p.is_floating_point())


def load_model(path: str | Path, dtype: str = "auto", device: str | torch.device = "cpu",
               weight_layout: str = "auto", quantization: str = "none", quantization_group_size: int = 128,
               field: str = "model", runs_beside: torch.nn.Module | None = None) -> LlamaForCausalLM:
    """A checkpoint directory as a packed inference model; `quantization` (one of `SCHEMES`; `auto` as
    `resolve_quantization` reads it) stores its linear layers in int8, int4 or a GGUF file's blocks
    (`field` names the config those settings came from in errors); `runs_beside` as `pack_for_inference`
    takes it. A layout with a kernel of its own (`onednn`, `blocked`, which `auto` may choose) releases
    the modules' weights: pass `weight_layout="linear"` to read them (training, export)."""
    directory = checkpoint_dir(path)
    quantization = resolve_quantization(quantization, gguf_source(directory) is not None, torch.device(device))
    check_quantization(quantization, quantization_group_size, torch.device(device), field)
    config: ModelConfig = load_model_config(directory)
    torch_dtype = resolve_dtype(dtype, config.torch_dtype)
    device = torch.device(device)
    gguf_file = gguf_file_of(directory)  # read once: its blocks decode once for the float tensors and the layouts
    tensors = read_tensors(directory, gguf_file=gguf_file)
    if config.tie_word_embeddings or "lm_head.weight" not in tensors:
        if not config.tie_word_embeddings:
            raise CheckpointError(f"{directory}: missing tensors ['lm_head.weight'] (and tie_word_embeddings is false)")
        if "model.embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    with meta_device():
        model = LlamaForCausalLM(config)
    assign_state(model, tensors, torch_dtype, device, str(directory))
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    if quantization in GGUF_SCHEMES:
        attach_gguf_blocks(model, directory, quantization, field, gguf_file)
    model.model.rotary.reset(device)
    model.eval().requires_grad_(False)
    pack_for_inference(model, weight_layout, device, Quantization(quantization, quantization_group_size), field,
                       runs_beside)
    return model
