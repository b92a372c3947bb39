"""A GGUF checkpoint (a named model or a `.gguf` file) -> a Hugging Face model folder that
transformers and vLLM load: config.json, model.safetensors, generation_config.json and the
tokenizer (tokenizer.json, tokenizer_config.json with the chat template).

transformers' own GGUF loading does the work (`from_pretrained(dir, gguf_file=...)`, every tensor
dequantized, then `save_pretrained`): its weights are bit for bit what our loader dequantizes
(tests/integration/test_models_export.py checks it on the Q4_1 file). The folder is written
beside DIR and moved into place only when complete, so a failed or interrupted export leaves DIR
as it was.
`force` replaces only a folder that holds a config.json (an earlier export, say), never one
that holds the GGUF being read. config.json and tokenizer_config.json also carry the keys that
transformers 4 (and the vLLM releases built on it) read: `rope_theta`, `torch_dtype` and a
`PreTrainedTokenizerFast` tokenizer class.

    info = export_hf("smollm2-135m", Path("out/smollm2"), dtype="bfloat16")
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mooncake_cli.engine import catalog
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.interfaces import ConfigError

EXPORT_DTYPES = ("bfloat16", "float32", "float16")
TRANSFORMERS_NEEDED = "pip install 'transformers>=4.56,<6' 'accelerate>=1.0'"


@dataclass(frozen=True)
class Exported:
    name: str
    source: str
    path: str
    dtype: str
    architecture: str
    parameters: int
    files: list[str]
    size: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_gguf(model: str, progress: Callable[[str], None] | None = None) -> Path:
    """A named model (fetched into the cache first if missing) or a `.gguf` file."""
    if model in catalog.CATALOG:
        return catalog.resolve(model, fetch=True, progress=progress)
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ModelError(f"model {model!r} is a folder: export takes a named model "
                         f"({', '.join(catalog.CATALOG)}) or a .gguf file")
    raise ModelError(f"model {model!r}: no such file and no named model (named models: "
                     f"{', '.join(catalog.CATALOG)}; or give the path of a .gguf file)")


def check_target(target: Path, force: bool) -> None:
    """DIR may be new, an empty folder, or (with force) a model folder to replace; never a file,
    and never a folder whose parents cannot hold it."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ConfigError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise ConfigError(f"{target} exists and is not empty (use --force to replace it)")
        if not (target / "config.json").is_file():
            raise ConfigError(f"{target} is not empty and holds no config.json: --force replaces "
                              "only a model folder (an earlier export); empty it or choose "
                              "another DIR")
    for up in target.parents:
        if up.exists():
            if not up.is_dir():
                raise ConfigError(f"cannot write the export folder {target}: {up} is not a "
                                  "folder")
            break


def export_hf(model: str, target: Path, dtype: str = "bfloat16", force: bool = False,
              progress: Callable[[str], None] | None = None) -> Exported:
    """Write `model` (a named model or a .gguf file) as a Hugging Face folder at `target`."""
    say = progress or (lambda _msg: None)
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"dtype {dtype!r}: use one of {', '.join(EXPORT_DTYPES)}")
    target = Path(os.path.abspath(target.expanduser()))
    check_target(target, force)
    gguf = resolve_gguf(model, progress=say)
    if target in gguf.resolve().parents or target in gguf.absolute().parents:
        raise ConfigError(f"{target} holds the model file {gguf}: export to another folder")

    from mooncake_cli.engine.gguf_file import GGUFCheckpoint
    from mooncake_cli.engine.model_config import ModelConfig

    ckpt = GGUFCheckpoint(gguf)  # a clear error for a file that is not a GGUF we can read
    cfg = ModelConfig.from_dict(ckpt.config_dict())
    made = _make_parents(target)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    except OSError as e:
        _remove(made)
        raise _write_error(target, e) from None
    try:
        say(f"dequantizing {gguf.name} ({ckpt.num_tensors} tensors, {cfg.architecture}, "
            f"{cfg.num_parameters() / 1e6:.1f}M parameters) to {dtype} with transformers ...")
        model_obj, tokenizer = _load(gguf, dtype)
        say(f"writing {target} ...")
        try:
            _save(model_obj, tokenizer, stage, ckpt.eos_ids())
        except OSError as e:
            raise _write_error(target, e) from None
        del model_obj
        check_target(target, force)  # nothing appeared there meanwhile
        _replace(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        _remove(made)
        raise
    files = sorted(p.name for p in target.iterdir())
    size = sum(p.stat().st_size for p in target.iterdir() if p.is_file())
    return Exported(model, str(gguf), str(target), dtype, cfg.architecture,
                    cfg.num_parameters(), files, size)


def _write_error(target: Path, e: OSError) -> OSError:
    return OSError(e.errno, f"cannot write the export folder {target}: "
                            f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else ""))


def _make_parents(target: Path) -> list[Path]:
    """Create the missing parents of `target`; the ones made, deepest first."""
    missing = [p for p in target.parents if not p.exists()]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove(missing)
        raise _write_error(target, e) from None
    return missing


def _remove(folders: list[Path]) -> None:
    for f in folders:  # deepest first; each only if still empty
        try:
            f.rmdir()
        except OSError:
            break


def _load(gguf: Path, dtype: str) -> tuple[Any, Any]:
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ModelError(f"exporting needs transformers and accelerate: {TRANSFORMERS_NEEDED}") \
            from None
    transformers.logging.set_verbosity_error()
    bars = sys.stderr.isatty()  # its tqdm bars are the progress on a terminal only
    if not bars:
        transformers.logging.disable_progress_bar()
    kwargs: dict[str, Any] = {"gguf_file": gguf.name, "dtype": getattr(torch, dtype)}
    gguf_config = getattr(transformers, "GgufConfig", None)
    if gguf_config is not None:  # transformers 5 keeps GGUF blocks packed unless told not to
        kwargs["quantization_config"] = gguf_config(dequantize=True)
    try:
        with _gguf_bar(bars):
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except ImportError as e:
        raise ModelError(f"exporting needs transformers and accelerate ({e}): "
                         f"{TRANSFORMERS_NEEDED}") from None
    except (ValueError, KeyError, RuntimeError, NotImplementedError, OSError) as e:
        raise ModelError(f"{gguf}: transformers {transformers.__version__} cannot load this "
                         f"GGUF ({e})") from None
    if getattr(model, "hf_quantizer", None) is not None:
        raise ModelError(f"{gguf}: transformers {transformers.__version__} kept the weights "
                         f"quantized; {TRANSFORMERS_NEEDED} and retry")
    return model, tokenizer


@contextmanager
def _gguf_bar(show: bool) -> Iterator[None]:
    """transformers' GGUF dequantizing bar is a plain tqdm that disable_progress_bar() does not
    reach: off while loading unless stderr is a terminal."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if show or bar is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _save(model: Any, tokenizer: Any, stage: Path, eos_ids: tuple[int, ...]) -> None:
    max_len = getattr(model.config, "max_position_embeddings", None)
    if max_len:
        tokenizer.model_max_length = int(max_len)
    gen = model.generation_config
    eos = gen.eos_token_id
    have = list(eos) if isinstance(eos, list | tuple) else [] if eos is None else [eos]
    merged = have + [i for i in eos_ids if i not in have]
    gen.eos_token_id = merged[0] if len(merged) == 1 else merged or None
    model.save_pretrained(str(stage), safe_serialization=True)
    tokenizer.save_pretrained(str(stage))
    # tokenizer_config.json carries the chat template too (transformers 5 writes it to
    # chat_template.jinja only; older readers look for it here), less the loading-time keys
    tc_path = stage / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "name_or_path"):
        tc.pop(key, None)
    if isinstance(getattr(tokenizer, "chat_template", None), str):
        tc["chat_template"] = tokenizer.chat_template
    if tc.get("tokenizer_class") == "TokenizersBackend":  # transformers 5's name for it
        tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    _write_json(tc_path, tc)
    # transformers 4 reads rope_theta and torch_dtype at the top level (5 reads both too)
    cfg_path = stage / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in cfg:
        cfg["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default" and "rope_scaling" not in cfg:
            cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if "dtype" in cfg and "torch_dtype" not in cfg:
        cfg["torch_dtype"] = cfg["dtype"]
    _write_json(cfg_path, cfg)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _replace(stage: Path, target: Path) -> None:
    """Move the finished folder to `target`, replacing what is there (checked beforehand); put
    back what was there if the move fails or is interrupted."""
    umask = os.umask(0)
    os.umask(umask)
    try:
        stage.chmod(0o777 & ~umask)  # mkdtemp (and safetensors' writer) make them private
        for f in stage.iterdir():
            f.chmod(0o666 & ~umask)
    except OSError as e:
        raise _write_error(target, e) from None
    old: Path | None = None
    emptied = False
    try:
        if target.is_dir():
            if any(target.iterdir()):
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                os.replace(target, old)
            else:
                target.rmdir()
                emptied = True
        os.replace(stage, target)
    except BaseException as e:
        if old is not None and not target.exists():
            os.replace(old, target)
        elif emptied and not target.exists():
            target.mkdir()
        if isinstance(e, OSError):
            raise _write_error(target, e) from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
