"""Ahead-of-time compiled forwards (`graphs.mode=aot`): `graph_forward` exported and compiled by
AOTInductor into a package per shape class, kept on disk and loaded in milliseconds by later runs.

Why beside `compiled.py`: a `torch.compile` graph is traced again by Dynamo in every process (most of
a warm start), and each call pays Dynamo's guards; a package is loaded without tracing and runs from
C++. Every tensor the model holds (weights, norms' constants, RoPE tables: `tensor_places`) and the KV
pool's tensors are inputs of the package, so it holds no weights: the cache key is the structure and
the shapes (model config, the pool's rows but not their number, captured layers, chain or tree, shape
class), never the values; the pool's size is symbolic, so one package serves every cache config.

Shape classes are the four of `compiled.py` (one request or several, one token each or several); the
context is symbolic from 2 positions up. A structure the exporter cannot take (a packed quantized
kernel, a size relation it cannot express) falls back to the `torch.compile` forward, with a warning.
A forward that only loads (`compile_missing=False`: `graphs.mode=auto`, whose packages a background
process compiles) raises `PackageMissing` instead of compiling and `NotExportable` instead of falling
back; a package it cannot read is deleted, to be compiled again.
"""

import getpass
import hashlib
import json
import logging
import os
import tempfile
import time
import warnings
import weakref
from pathlib import Path

import torch

from eyas.engine.graphs.compiled import CompiledForward, prepare_model
from eyas.engine.graphs.graph_attention import GraphAttention, paged_kernel_runs
from eyas.engine.graphs.graph_forward import graph_forward
from eyas.engine.graphs.tensor_places import NotExportable, standing_in, tensor_places
from eyas.engine.models.fused_linear import FusedLinear
from eyas.engine.models.blocked_weights import BlockedWeights
from eyas.engine.models.gguf_block_weights import GgufBlockWeights
from eyas.engine.models.onednn_weights import OneDnnWeights
from eyas.kernels import cpu_ops

log = logging.getLogger("eyas.graphs")
# (id(model), id(pool), capture layers, tree) -> its forward, while a runner holds it (it holds the model)
_EXPORTED: "weakref.WeakValueDictionary[tuple, ExportedForward]" = weakref.WeakValueDictionary()
_SOURCES = ("graphs", "models", "attention")  # engine/ folders whose code a package compiles in


def load_runner(path: Path):
    """A package's runner (`boxed_run`, `get_call_spec`), read by AOTInductor's own C++ package loader:
    `torch._inductor.aoti_load_package` imports inductor and Dynamo first, 2 s of a start whose six
    packages load in 0.1 s. The public loader stays the fallback, and says why a package cannot be read."""
    loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader is not None:
        try:
            return loader(str(path), "model", False, 1, -1)  # model name, single-threaded, runners, device index
        except RuntimeError:
            pass
    return torch._inductor.aoti_load_package(str(path)).loader


def package_dir(cache_dir: str | None) -> Path:
    """Where packages are kept: `graphs.cache_dir`, else inductor's cache directory, under eyas-aot/."""
    return Path(cache_dir or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                or Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}").expanduser() / "eyas-aot"


class PackageMissing(Exception):
    """A forward that only loads found no readable package for a shape (or cannot be exported at all)."""


class _PoolView:
    """What `graph_forward` reads of a KV pool, with the package's inputs as its tensors."""

    def __init__(self, k: list, v: list, num_slots: int):
        self.k, self.v, self.num_slots = k, v, num_slots


class _Exportable(torch.nn.Module):
    """`graph_forward` with every tensor it reads as an input. It holds the model outside its module
    tree, so the exporter lifts no parameter of its own."""

    def __init__(self, model, num_slots: int, max_position: int, capture_layers: tuple[int, ...], places: list,
                 paged_kernel: bool):
        super().__init__()
        object.__setattr__(self, "_model", model)
        self.num_slots, self.max_position, self.capture_layers, self.places = num_slots, max_position, capture_layers, places
        self.attention = GraphAttention(model.config.head_dim, paged_kernel)

    def forward(self, tokens, positions, out_cache_loc, context_slots, k, v, tensors, named):
        with standing_in(self._model, self.places, tensors):
            return graph_forward(self._model, _PoolView(k, v, self.num_slots), self.attention, self.max_position,
                                 self.capture_layers, tokens, positions, out_cache_loc, context_slots, **named)


class ExportedForward:
    def __init__(self, model, kv_pool, capture_layers: tuple[int, ...], tree: bool, max_position: int,
                 max_batch_size: int, cache_dir: str | None, compile_missing: bool = True):
        prepare_model(model, max_position)
        self.compile_missing = compile_missing
        self.model, self.kv_pool, self.tree = model, kv_pool, tree
        self.capture_layers, self.max_position, self.max_batch_size = tuple(capture_layers), max_position, max_batch_size
        self.name = f"{type(model).__name__}{' tree' if tree else ''}"
        self.cache_dir = package_dir(cache_dir)
        self.compile_s = 0.0
        self.shapes_seen: set[tuple[bool, bool]] = set()
        self._packages: dict[tuple[bool, bool], object] = {}
        self._fallback: CompiledForward | None = None
        try:
            if any(isinstance(v, FusedLinear) and v.kernel is not None
                   and not isinstance(v.kernel, (OneDnnWeights, BlockedWeights, GgufBlockWeights))
                   for m in model.modules() for v in vars(m).values()):
                raise NotExportable("a compressed weight format runs its own kernel")
            found = tensor_places(model)
        except NotExportable as exc:
            self._fall_back(str(exc))
            return
        self.places = [place for place, _ in found]
        # the tensors the model reads and the pool's: fixed once loaded (RoPE tables filled above)
        self._held = [*kv_pool.k, *kv_pool.v, *(tensor for _, tensor in found)]
        self.paged_kernel = paged_kernel_runs(kv_pool)  # in the key: a package calling the op needs it built
        self._module = _Exportable(model, kv_pool.num_slots, max_position, self.capture_layers, self.places,
                                   self.paged_kernel)

    def __call__(self, tokens, positions, out_cache_loc, context_slots, **named):
        if self._fallback is not None:
            return self._fallback(tokens, positions, out_cache_loc, context_slots, **named)
        shape = (tokens.shape[0] == 1, tokens.shape[1] == 1)
        # a package reads its inputs with the strides they were exported with (row-major): a view with
        # others (a draft model's features cut from a wider tensor) is copied first
        tokens, positions, out_cache_loc, context_slots = (t.contiguous() for t in (tokens, positions, out_cache_loc, context_slots))
        named = {name: tensor.contiguous() for name, tensor in named.items()}
        names = sorted(named)
        package = self._packages.get(shape)
        if package is None:
            layers = len(self.kv_pool.k)
            inputs = (tokens, positions, out_cache_loc, context_slots, self._held[:layers],
                      self._held[layers:2 * layers], self._held[2 * layers:], {name: named[name] for name in names})
            package = self._load(shape, inputs)
            if package is None:  # the exporter refused: compiled instead, from now on
                return self(tokens, positions, out_cache_loc, context_slots, **named)
        loader, unflatten = package
        # the package's inputs flattened as the exporter saw them: args in order, the named dict by key
        return unflatten(loader.boxed_run([tokens, positions, out_cache_loc, context_slots, *self._held,
                                           *(named[name] for name in names)]))

    def _fall_back(self, reason: str) -> None:
        if not self.compile_missing:  # no package will ever come: the caller stays eager
            raise NotExportable(f"the {self.name} forward ({reason})")
        log.warning("the %s forward is not exportable (%s): it runs as a torch.compile graph", self.name, reason)
        self._fallback = CompiledForward(self.model, self.kv_pool, self.capture_layers, self.tree, self.max_position)
        self._fallback.shapes_seen = self.shapes_seen

    def _load(self, shape: tuple[bool, bool], inputs: tuple):
        path = self.cache_dir / f"{self._key(shape, inputs)}.pt2"
        start = time.perf_counter()
        if not self.compile_missing:
            return self._load_only(shape, path)
        try:
            if not path.exists():
                log.warning("compiling the %s forward for %s request%s of %s token%s ahead of time (once; kept in %s)",
                            self.name, *(("one", "") if shape[0] else ("several", "s")),
                            *(("one", "") if shape[1] else ("several", "s")), self.cache_dir)
                self._compile(shape, inputs, path)
            loader = load_runner(path)
        except Exception as exc:  # noqa: BLE001 - an exporter refusal or an unreadable package: compile is still exact
            self._fall_back(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return None
        package = self._packages[shape] = (loader, _unflattener(torch.utils._pytree.treespec_loads(loader.get_call_spec()[1])))
        self.compile_s += time.perf_counter() - start
        self.shapes_seen.add(shape)
        return package

    def _load_only(self, shape: tuple[bool, bool], path: Path):
        if not path.exists():
            raise PackageMissing(f"no package of the {self.name} forward for shape {shape} in {self.cache_dir}")
        try:
            loader = load_runner(path)
        except Exception as exc:  # noqa: BLE001 - a corrupt package is compiled again, never trusted
            path.unlink(missing_ok=True)
            raise PackageMissing(f"the package {path.name} could not be read ({type(exc).__name__}): removed") from exc
        package = self._packages[shape] = (loader, _unflattener(torch.utils._pytree.treespec_loads(loader.get_call_spec()[1])))
        self.shapes_seen.add(shape)
        return package

    def _compile(self, shape: tuple[bool, bool], inputs: tuple, path: Path) -> None:
        tokens, positions, out_cache_loc, context_slots, k, v, tensors, named = inputs
        batch = 1 if shape[0] else torch.export.Dim("batch", min=2, max=max(2, self.max_batch_size))
        width = 1 if shape[1] else torch.export.Dim("width", min=2, max=self.max_position)
        context = torch.export.Dim("context", min=2, max=self.max_position + 1)
        per_token = {0: batch, 1: width}
        per_token = {d: s for d, s in per_token.items() if not isinstance(s, int)} or None
        named_dims = {}
        for name, tensor in named.items():
            if name == "node_mask":  # [B, w, w]
                named_dims[name] = {d: s for d, s in {0: batch, 1: width, 2: width}.items() if not isinstance(s, int)} or None
            elif name == "prefix_lens":  # [B]
                named_dims[name] = None if isinstance(batch, int) else {0: batch}
            else:  # a draft model's features [B * w, H]: only expressible with one of the two fixed at 1
                if not (isinstance(batch, int) or isinstance(width, int)):
                    raise NotExportable(f"{name} has B x w rows")
                rows = width if isinstance(batch, int) else batch
                named_dims[name] = None if isinstance(rows, int) else {0: rows}
        slots = {d: s for d, s in {0: batch, 1: context}.items() if not isinstance(s, int)}
        pool_rows = {0: torch.export.Dim("pool_rows", min=2)}  # any pool size: one package serves every cache config
        dynamic = (per_token, per_token, per_token, slots, [pool_rows] * len(k), [pool_rows] * len(v),
                   [None] * len(tensors), named_dims)
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)  # the exporter's own deprecations
            exported = torch.export.export(self._module, inputs, dynamic_shapes=dynamic)
        if exported.constants or exported.state_dict:
            raise NotExportable(f"the graph would hold {len(exported.constants) + len(exported.state_dict)} tensors "
                                f"of its own ({', '.join(list(exported.constants)[:3])}, ...)")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.pt2")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            torch._inductor.aoti_compile_and_package(exported, package_path=str(partial))
        os.replace(partial, path)  # whole or absent: a second engine never loads half a package

    def _key(self, shape: tuple[bool, bool], inputs: tuple) -> str:
        tokens, positions, out_cache_loc, context_slots, k, v, tensors, named = inputs
        described = lambda t: [str(t.dtype), list(t.shape), list(t.stride()) if t.layout == torch.strided  # noqa: E731
                               else str(t.layout)]
        rows_free = lambda t: [str(t.dtype), list(t.shape[1:]), list(t.stride())]  # noqa: E731 - a pool's size is symbolic
        digest = hashlib.sha256()
        digest.update(json.dumps({
            "torch": torch.__version__, "model": type(self.model).__name__, "config": repr(self.model.config),
            "tree": self.tree, "capture": list(self.capture_layers), "shape": list(shape),
            "max_position": self.max_position, "max_batch": self.max_batch_size,
            "pool": [rows_free(t) for t in (*k, *v)], "places": [str(p) for p in self.places],
            "tensors": [described(t) for t in tensors], "named": sorted(named),
            "tokens": str(tokens.dtype), "device": str(tokens.device), "paged_kernel": self.paged_kernel,
        }, sort_keys=True).encode())
        engine_dir = Path(__file__).resolve().parents[1]
        for folder in _SOURCES:
            for source in sorted((engine_dir / folder).glob("*.py")):
                digest.update(source.read_bytes())
        for source in sorted(cpu_ops.SOURCES[0].parent.glob("cpu_*")):  # the C++ ops a package may call, their wrappers
            digest.update(source.read_bytes())
        return digest.hexdigest()[:32]


def _unflattener(spec):
    """outputs -> the forward's (hidden, [aux, ...]); no pytree walk, whose cost every call of every step would pay."""
    probe = torch.utils._pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    if isinstance(probe, tuple) and len(probe) == 2 and probe[0] == 0 and probe[1] == list(range(1, spec.num_leaves)):
        return lambda outputs: (outputs[0], outputs[1:])
    return lambda outputs: torch.utils._pytree.tree_unflatten(outputs, spec)


def exported_forward(model, kv_pool, capture_layers: tuple[int, ...], tree: bool, max_position: int,
                     max_batch_size: int, cache_dir: str | None, compile_missing: bool = True) -> ExportedForward:
    """The ahead-of-time compiled `graph_forward` of `model` over `kv_pool` (built on first use, then shared)."""
    key = (id(model), id(kv_pool), tuple(capture_layers), tree, compile_missing)
    forward = _EXPORTED.get(key)
    if forward is None:
        forward = _EXPORTED[key] = ExportedForward(model, kv_pool, tuple(capture_layers), tree, max_position,
                                                   max_batch_size, cache_dir, compile_missing)
    return forward
