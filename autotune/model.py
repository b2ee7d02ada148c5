"""Model presets: a `ModelSpec` per YAML file in search_spaces/models/, loaded by name or path."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError

__all__ = ["MODEL_NAME_MAX", "ModelSpec", "list_presets", "load_model", "padded_vocab_size",
           "read_text", "search_spaces_dir"]

MODEL_NAME_MAX = 100
"""Characters of a model's `name:`; it titles reports and exported scripts."""



def search_spaces_dir() -> Traversable:
    """The presets and search spaces: shipped as autotune.search_spaces when installed, read
    from the repository's search_spaces/ when autotune runs from a checkout on PYTHONPATH
    (as on GPU nodes without an install)."""
    try:
        return resources.files("autotune.search_spaces")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "search_spaces"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """The shape of a decoder-only transformer, in Megatron's terms."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int | None = None
    """GQA groups (Megatron `--num-query-groups`); None means multi-head attention."""
    ffn_hidden_size: int | None = None
    """MLP width; None means 4 * hidden_size, as Megatron defaults."""
    vocab_size: int
    seq_length: int
    max_position_embeddings: int | None = None
    global_batch_size: int
    """The preset's global batch in sequences; `--global-batch-size` overrides it."""
    num_experts: int | None = None
    moe_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    """Expert MLP width; None means ffn_hidden_size."""
    gated_linear_unit: bool = False
    """SwiGLU-style MLP: three h x f matrices instead of two."""
    activation: str = "gelu"
    normalization: str = "LayerNorm"
    add_bias_linear: bool = True
    tied_embeddings: bool = True
    position_embedding: str = "learned_absolute"
    rotary_base: int = 10000
    hidden_dropout: float = 0.1
    """Megatron's default (--hidden-dropout); GPT-2 trains with it, Llama and Mixtral with 0."""
    attention_dropout: float = 0.1
    make_vocab_size_divisible_by: int = 128

    def __post_init__(self) -> None:
        # The name reaches report titles, script comments and the default study name: one
        # printable line (no newline or other control character), of a sensible length.
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"model name must be a non-empty string, got {self.name!r}")
        if not self.name.isprintable() or len(self.name) > MODEL_NAME_MAX:
            shown = self.name if len(self.name) <= 40 else self.name[:40] + "..."
            raise ConfigError(f"model name {shown!r} must be one line of at most "
                              f"{MODEL_NAME_MAX} printable characters")
        for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
                     "seq_length", "global_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model {self.name}: {name} must be a positive integer, "
                                  f"got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"model {self.name}: hidden_size={self.hidden_size} must be "
                              f"divisible by num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.query_groups:
            raise ConfigError(f"model {self.name}: num_query_groups={self.query_groups} must "
                              f"divide num_attention_heads={self.num_attention_heads}")
        for name, allowed in (("normalization", ("LayerNorm", "RMSNorm")),
                              ("activation", ("gelu", "swiglu", "silu", "squared_relu"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model {self.name}: {name} must be one of "
                                  f"{', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.position_embedding not in ("learned_absolute", "rope", "none"):
            raise ConfigError(f"model {self.name}: position_embedding must be learned_absolute, "
                              f"rope or none, got {self.position_embedding!r}")
        if self.num_experts is not None and not 1 <= self.moe_topk <= self.num_experts:
            raise ConfigError(f"model {self.name}: moe_topk={self.moe_topk} must be between 1 "
                              f"and num_experts={self.num_experts}")

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings or self.seq_length

    def with_overrides(self, *, seq_length: int | None = None,
                       global_batch_size: int | None = None) -> ModelSpec:
        """The same model with a different sequence length or global batch (CLI overrides)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if seq_length is not None:
            values["seq_length"] = seq_length
            values["max_position_embeddings"] = max(seq_length, self.max_positions)
        if global_batch_size is not None:
            values["global_batch_size"] = global_batch_size
        return ModelSpec(**values)


def padded_vocab_size(model: ModelSpec, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * tp.

    Source: Megatron-LM megatron/training/tokenizer/tokenizer.py, `_vocab_size_with_padding`.
    """
    multiple = model.make_vocab_size_divisible_by * tp
    return -(-model.vocab_size // multiple) * multiple


def _preset_files() -> dict[str, Any]:
    root = search_spaces_dir().joinpath("models")
    return {p.name.removesuffix(".yaml"): p for p in root.iterdir() if p.name.endswith(".yaml")}


def list_presets() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(_preset_files())


def _from_mapping(data: Any, source: str) -> ModelSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of model fields, got "
                          f"{type(data).__name__}")
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown model field(s) {', '.join(unknown)}")
    try:
        return ModelSpec(**data)
    except TypeError as exc:  # a required field is missing
        missing = sorted(f.name for f in fields(ModelSpec)
                         if f.name not in data and f.name in _REQUIRED)
        raise ConfigError(f"{source}: missing model field(s) {', '.join(missing)}") from exc


_REQUIRED = ("name", "num_layers", "hidden_size", "num_attention_heads", "vocab_size",
             "seq_length", "global_batch_size")


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of a file the user named (`what`: "model file", ...), or ConfigError in
    one line: missing, a folder, unreadable, or not UTF-8 text."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                          f"offset {exc.start})") from None


def _read_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{source}: malformed YAML{where}") from exc


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name (`gpt2-xl`), a model YAML file by path, or a Hugging Face config.json
    (or a folder holding one: autotune.hf_config)."""
    from autotune.hf_config import is_hf_config, load_hf_config

    if is_hf_config(name_or_path):
        return load_hf_config(name_or_path)
    looks_like_path = name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path
    if looks_like_path:
        path = Path(name_or_path)
        data = _read_yaml(read_text(path, "model file"), str(path))
        if isinstance(data, dict):
            data.setdefault("name", path.stem)
        return _from_mapping(data, str(path))
    presets = _preset_files()
    if name_or_path not in presets:
        close = difflib.get_close_matches(name_or_path, list(presets), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `autotune models`"
        raise ConfigError(f"unknown model {name_or_path!r}{hint}")
    source = f"preset {name_or_path}"
    return _from_mapping(_read_yaml(presets[name_or_path].read_text(), source), source)
