"""What `model.path` names, as the Hugging Face directory the rest of eyas reads.

- a directory: itself;
- a name of `catalog.CATALOG` (`smollm2`) that is no local path: the catalog's GGUF file, fetched once;
- a `.gguf` file: a small directory in the cache root holding the file's metadata as Hugging Face files
  (config.json, tokenizer.json, tokenizer_config.json, generation_config.json) and `gguf.json`, which names
  the file the weights are read from. It is keyed by the file's path, size and modification time and
  this module's format, written whole or not at all, and rebuilt when any of those change.
"""

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from eyas.engine.cache_root import cache_root
from eyas.engine.errors import CheckpointError
from eyas.engine.models.catalog import CATALOG, catalog_file

GGUF_POINTER = "gguf.json"  # in a metadata directory: {"file": the GGUF file's absolute path}
FORMAT = 1  # bumped when what the metadata directory holds changes


def checkpoint_directory(path: str | Path) -> Path:
    """The Hugging Face directory `model.path` names (see the module's doc)."""
    location = Path(path).expanduser()
    if location.is_dir():
        return location
    if str(path) in CATALOG and not location.exists():
        location = catalog_file(str(path))
    if location.suffix == ".gguf":
        if not location.is_file():
            raise CheckpointError(f"model.path: GGUF file not found: {location}")
        return gguf_metadata_dir(location.resolve())
    if location.exists():
        raise CheckpointError(f"model.path must name a Hugging Face model directory or a .gguf file, got the file "
                              f"{location}")
    raise CheckpointError(f"checkpoint directory not found: {location} (set model.path to a Hugging Face model "
                          f"directory, a .gguf file or one of {sorted(CATALOG)})")


def gguf_source(directory: Path) -> Path | None:
    """The GGUF file a metadata directory stands for, or None for a Hugging Face directory."""
    pointer = directory / GGUF_POINTER
    if not pointer.is_file():
        return None
    return Path(json.loads(pointer.read_text())["file"])


def gguf_metadata_dir(file: Path) -> Path:
    stat = file.stat()
    key = hashlib.sha256(f"{FORMAT}\0{file}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    directory = cache_root() / "gguf" / f"{file.stem}-{key}"
    if (directory / GGUF_POINTER).is_file():
        return directory
    from eyas.engine.models.gguf_file import GGUFFile
    from eyas.engine.models.gguf_tokenizer import tokenizer_config, tokenizer_json

    gguf = GGUFFile(file)
    config = gguf.hf_config()
    files = {"config.json": config,
             "generation_config.json": {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}}
    if gguf.field("tokenizer.ggml.tokens") is not None:
        files["tokenizer.json"] = tokenizer_json(gguf)
        files["tokenizer_config.json"] = tokenizer_config(gguf)
    files[GGUF_POINTER] = {"file": str(file)}  # written last: its presence marks a whole directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".building-"))
    try:
        for name, content in files.items():
            (staging / name).write_text(json.dumps(content, ensure_ascii=False))
        try:
            os.replace(staging, directory)
        except OSError:  # another process built it first (or a stale, incomplete one is there)
            if not (directory / GGUF_POINTER).is_file():
                shutil.rmtree(directory, ignore_errors=True)
                os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
