"""Model presets, a `ModelSpec` per YAML file in search_spaces/models/, and `load_model`: a
model by name or path, whatever form the user has it in (a preset, a model YAML file, a Hugging
Face config.json through autotune.specs.hf_config)."""

from __future__ import annotations

import difflib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs.documents import parse_yaml
from autotune.inputs.files import MAX_YAML_BYTES, read_text
from autotune.specs.hf_config import is_hf_config, load_hf_config
from autotune.specs.model import ModelSpec, model_from_mapping
from autotune.specs.params import check_size

__all__ = ["list_presets", "load_model", "search_spaces_dir"]


def search_spaces_dir() -> Traversable:
    """The presets and search spaces: shipped as autotune.search_spaces when installed, read
    from the repository's search_spaces/ when autotune runs from a checkout on PYTHONPATH
    (as on GPU nodes without an install)."""
    try:
        return resources.files("autotune.search_spaces")
    except ModuleNotFoundError:  # the checkout: search_spaces/ beside the package
        return Path(str(resources.files("autotune"))).parent / "search_spaces"


def shipped_yaml(folder: str = "") -> dict[str, Traversable]:
    """The YAML files autotune ships in search_spaces/FOLDER (the search spaces themselves for
    ""), by name without `.yaml`; none where an install lacks the folder."""
    root = search_spaces_dir().joinpath(folder) if folder else search_spaces_dir()
    if not root.is_dir():
        return {}
    return {f.name.removesuffix(".yaml"): f for f in root.iterdir() if f.name.endswith(".yaml")}


def _preset_files() -> dict[str, Any]:
    return shipped_yaml("models")


def list_presets() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(_preset_files())


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name (`gpt2-xl`), a model YAML file by path, or a Hugging Face config.json
    (or a folder holding one: autotune.specs.hf_config)."""
    what = ("give a preset name (autotune models), a model YAML file, or a Hugging Face "
            "config.json (or its folder)")
    if not name_or_path.strip():  # an unset variable; '' would be read as the folder '.'
        raise ConfigError(f"the model {name_or_path!r} is empty; {what}")
    path = Path(name_or_path)
    if name_or_path not in _preset_files() and path.is_dir() \
            and not (path / "config.json").is_file():
        raise ConfigError(f"{name_or_path} is a folder; {what}")
    if is_hf_config(name_or_path):
        return load_hf_config(name_or_path)
    looks_like_path = name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path
    if looks_like_path:
        path = Path(name_or_path)
        data = parse_yaml(read_text(path, "model file", max_bytes=MAX_YAML_BYTES), str(path))
        if isinstance(data, dict):
            data.setdefault("name", path.stem)
        return check_size(model_from_mapping(data, str(path)))
    presets = _preset_files()
    if name_or_path not in presets:
        close = difflib.get_close_matches(name_or_path, list(presets), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `autotune models`"
        raise ConfigError(f"unknown model {name_or_path!r}{hint}")
    source = f"preset {name_or_path}"
    return model_from_mapping(parse_yaml(presets[name_or_path].read_text(), source), source)
