from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.specs.model import padded_vocab_size
from autotune.specs.params import count_parameters
from autotune.specs.presets import list_presets, load_model

# name, layers, hidden, heads, groups, vocab, seq, params (billions, rounded as papers quote them)
PRESETS = [
    ("gpt2", 12, 768, 12, 12, 50257, 1024, 0.124),
    ("gpt2-medium", 24, 1024, 16, 16, 50257, 1024, 0.35),
    ("gpt2-large", 36, 1280, 20, 20, 50257, 1024, 0.77),
    ("gpt2-xl", 48, 1600, 25, 25, 50257, 1024, 1.558),
    # Narayanan et al. 2021, Table 1: the parameter column.
    # Table 1 prints 1.7 for the first row; its own formula, 12 l h^2 (1 + 13/(12h) +
    # (V + s)/(12 l h)), gives 1.652e9 for l=24, h=2304, V=51200, s=2048.
    ("gpt-1.7b", 24, 2304, 24, 24, 51200, 2048, 1.652),
    ("gpt-3.6b", 30, 3072, 32, 32, 51200, 2048, 3.6),
    ("gpt-7.5b", 36, 4096, 32, 32, 51200, 2048, 7.5),
    ("gpt-18b", 40, 6144, 48, 48, 51200, 2048, 18.4),
    ("gpt-39b", 48, 8192, 64, 64, 51200, 2048, 39.1),
    ("gpt-76b", 60, 10240, 80, 80, 51200, 2048, 76.1),
    ("gpt-145b", 80, 12288, 96, 96, 51200, 2048, 145.6),
    ("gpt-310b", 96, 16384, 128, 128, 51200, 2048, 310.1),
    ("gpt-530b", 105, 20480, 128, 128, 51200, 2048, 529.6),
    ("gpt-1t", 128, 25600, 160, 160, 51200, 2048, 1008.0),
    ("gpt3-175b", 96, 12288, 96, 96, 50257, 2048, 174.6),
    ("llama3-8b", 32, 4096, 32, 8, 128256, 8192, 8.0),
    ("llama2-13b", 40, 5120, 40, 40, 32000, 4096, 13.0),  # Touvron et al. 2023, Table 1
    ("llama3-70b", 80, 8192, 64, 8, 128256, 8192, 70.6),
    ("mixtral-8x7b", 32, 4096, 32, 8, 32000, 4096, 46.7),
]


@pytest.mark.parametrize(("name", "layers", "hidden", "heads", "groups", "vocab", "seq",
                          "billions"), PRESETS)
def test_preset_shapes_and_sizes(name: str, layers: int, hidden: int, heads: int, groups: int,
                                 vocab: int, seq: int, billions: float) -> None:
    m = load_model(name)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.query_groups,
            m.vocab_size, m.seq_length) == (layers, hidden, heads, groups, vocab, seq)
    # Within 1.5% of the published size (papers round, and count vocab padding differently).
    assert count_parameters(m) == pytest.approx(billions * 1e9, rel=0.015)


def test_every_preset_is_listed() -> None:
    assert sorted(p[0] for p in PRESETS) == list_presets()


@pytest.mark.parametrize(("name", "tied", "positions", "gated", "experts"), [
    ("gpt2-xl", True, "learned_absolute", False, None),
    ("llama3-8b", False, "rope", True, None),
    ("mixtral-8x7b", False, "rope", True, 8),
])
def test_architecture_flags(name: str, tied: bool, positions: str, gated: bool,
                            experts: int | None) -> None:
    m = load_model(name)
    assert (m.tied_embeddings, m.position_embedding, m.gated_linear_unit, m.num_experts) == (
        tied, positions, gated, experts)


@pytest.mark.parametrize(("vocab", "tp", "padded"), [(50257, 1, 50304), (50257, 2, 50432),
                                                     (51200, 8, 51200), (128256, 8, 129024)])
def test_vocab_padding_follows_megatron(vocab: int, tp: int, padded: int) -> None:
    m = load_model("gpt2").with_overrides()
    m = type(m)(**{**{f: getattr(m, f) for f in m.__dataclass_fields__}, "vocab_size": vocab})
    assert padded_vocab_size(m, tp) == padded


def test_overrides_change_only_what_is_asked() -> None:
    m = load_model("gpt2-xl")
    longer = m.with_overrides(seq_length=2048, global_batch_size=128)
    assert (longer.seq_length, longer.global_batch_size, longer.max_positions) == (2048, 128, 2048)
    assert longer.num_layers == m.num_layers


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
                    "vocab_size: 1000\nseq_length: 128\nglobal_batch_size: 8\n")
    m = load_model(str(path))
    assert (m.name, m.num_layers, m.ffn_size) == ("tiny", 2, 256)


@pytest.mark.parametrize(("text", "message"), [
    ("num_layers: [", "malformed YAML"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("num_layers: 2\n", "missing model field"),
    ("name: x\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n"
     "seq_length: 8\nglobal_batch_size: 8\nbogus: 1\n", "unknown model field(s) bogus"),
    ("name: x\nnum_layers: 2\nhidden_size: 65\nnum_attention_heads: 4\nvocab_size: 10\n"
     "seq_length: 8\nglobal_batch_size: 8\n", "hidden_size=65 must be divisible"),
    ("name: x\nnum_layers: 0\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n"
     "seq_length: 8\nglobal_batch_size: 8\n", "num_layers must be a positive integer"),
    ("name: x\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n"
     "seq_length: 8\nglobal_batch_size: 8\nnormalization: foo\n",
     "normalization must be one of LayerNorm, RMSNorm, got 'foo'"),
    ("name: x\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n"
     "seq_length: 8\nglobal_batch_size: 8\nactivation: relu\n",
     "activation must be one of gelu, swiglu, silu, squared_relu, got 'relu'"),
])
def test_bad_model_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(str(path))


@pytest.mark.parametrize(("name", "suggestion"), [("gpt2-xxl", "gpt2-xl"),
                                                  ("llama3-7b", "llama3-8b"),
                                                  ("mixtral", "mixtral-8x7b")])
def test_unknown_preset_suggests_close_names(name: str, suggestion: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean .*{suggestion}"):
        load_model(name)


def test_missing_model_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_model("no/such/model.yaml")
