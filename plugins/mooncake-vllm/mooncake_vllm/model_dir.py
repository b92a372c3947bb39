"""The Hugging Face folder vLLM loads for a worker's --model: a folder as it is; a named model
or a .gguf file exported once (`mooncake models export`) into the cache, beside the models
(XDG_CACHE_HOME/mooncake/hf/NAME), where later starts find it."""

from __future__ import annotations

import logging
from pathlib import Path

from mooncake_cli.engine import demo
from mooncake_cli.engine.catalog import cache_dir
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.interfaces import ConfigError

log = logging.getLogger("mooncake.vllm")


def export_dir(model: str) -> Path:
    return cache_dir().parent / "hf" / Path(model).stem


def model_folder(model: str) -> Path:
    """The folder of `model` (exported first if needed); ConfigError for the random demos,
    which vLLM cannot load, and for a model that does not exist."""
    if model in demo.DEMOS:
        raise ConfigError(f"model {model!r} is a random demo of the native engine: vLLM needs a "
                          "Hugging Face folder, a .gguf file or a named model "
                          "(mooncake models)")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} is not a Hugging Face model folder (no config.json)")
        return path
    target = export_dir(model)
    if (target / "config.json").is_file():
        return target
    from mooncake_cli.engine.export import export_hf

    log.warning("exporting %s as a Hugging Face folder for vLLM into %s (once)", model, target)
    try:
        export_hf(model, target, progress=lambda msg: log.warning("%s", msg))
    except ModelError as e:
        raise ConfigError(str(e)) from None
    return target
