from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check
from autotune.search.space import SearchSpace, enumerate_space, load_space, space_from_mapping
from autotune.specs.presets import load_model
from tests.conftest import cluster

SMALL = {"tp": [1, 2, 4], "pp": [1, 2, 4], "vpp": [1, 2], "mbs": [1, 4, 16],
         "sequence_parallel": [False, True], "distributed_optimizer": [False, True],
         "overlap_grad_reduce": [True], "overlap_param_gather": [False, True],
         "impl": ["local", "te"], "cp": [1, 2]}


def _brute_force(space: SearchSpace, model_name: str, gpus: int) -> set[Layout]:
    model, c = load_model(model_name), cluster(gpus)
    names = list(space.candidates)
    valid = set()
    for values in itertools.product(*(space.candidates[n] for n in names)):
        fields = dict(zip(names, values, strict=True))
        inner = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
        s = Layout(gbs=model.global_batch_size, dp=max(1, gpus // inner), **fields)
        if not check(s, model, c):
            valid.add(s)
    return valid


@pytest.mark.parametrize(("model", "gpus"), [("gpt2-xl", 8), ("gpt2-large", 4),
                                             ("llama3-8b", 8), ("gpt2", 6)])
def test_enumeration_matches_brute_force(model: str, gpus: int) -> None:
    space = space_from_mapping(SMALL, "small")
    summary = enumerate_space(space, load_model(model), cluster(gpus))
    assert set(summary.valid) == _brute_force(space, model, gpus)
    assert len(set(summary.valid)) == len(summary.valid)
    assert summary.total == len(summary.valid) + sum(g.count for g in summary.rejected.values())


def test_gpt2_xl_on_8_gpus_limits_tp_to_1() -> None:
    summary = enumerate_space(load_space(), load_model("gpt2-xl"), cluster(8))
    assert summary.valid_values("tp") == [1]
    assert summary.rejected["tp_heads"].count > 0
    assert "tp=2 must divide num_attention_heads=25" in summary.rejected["tp_heads"].examples


def test_default_space_loads_every_dimension() -> None:
    space = load_space()
    assert space.candidates["recompute"] == ("none", "selective", "full")
    assert space.candidates["impl"] == ("local", "sdpa", "te")
    assert 1 in space.candidates["tp"] and 8 in space.candidates["tp"]


@pytest.mark.parametrize(("text", "message"), [
    ("tp: [1, 2\n", "malformed YAML"),
    ("[1, 2]\n", "expected a mapping"),
    ("tp: [1]\nwarp: [2]\n", "unknown dimension"),
    ("tp: [0, 1]\n", "positive integers"),
    ("tp: [1, 1]\n", "lists a candidate twice"),
    ("sequence_parallel: [yes-please]\n", "true or false"),
    ("tp: []\n", "at least one candidate"),
    ("impl: [1]\n", "must be strings"),
    ("impl: [sdpa, flash]\n", "impl candidates must be among local, te, sdpa, got 'flash'"),
    ("recompute: [none, partial]\n", "recompute candidates must be among none, selective"),
    ("recompute_method: [foo]\n", "recompute_method candidates must be among uniform, block"),
])
def test_bad_space_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_space(str(path))


def test_missing_dimensions_keep_defaults(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("mbs: [1, 2]\n")
    summary = enumerate_space(load_space(str(path)), load_model("gpt2"), cluster(4))
    assert sorted(s.mbs for s in summary.valid) == [1, 2]
    assert all(s.tp == 1 and s.dp == 4 for s in summary.valid)


def test_enumerating_the_same_space_twice_gives_an_answer_of_its_own() -> None:
    from autotune.search.space import enumerate_space, load_space
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.presets import load_model

    space, model, cluster = load_space(None), load_model("gpt2-xl"), ClusterSpec.make(8)
    first = enumerate_space(space, model, cluster)
    first.valid.clear()  # a caller's change stays its own
    second = enumerate_space(space, model, cluster)
    assert second.valid and second.total == first.total
    assert enumerate_space(space, model, ClusterSpec.make(4)).valid != second.valid


@pytest.mark.parametrize(("model", "gpus", "gbs", "found"), [
    ("gpt2-xl", 8, None, (True, True)), ("llama3-8b", 64, None, (True, True)),
    ("gpt2", 6, None, (True, False)),  # SMALL's tp and pp leave 6 GPUs no layout
    # 56 GPUs leave dp 7, 14, 28 or 56, none dividing a batch of 512 (gbs_batch); no tp x pp x
    # cp of gpt2-xl makes 7 GPUs (the spaces offer no pp 7). 24 GPUs: the default space's pp 3
    # with its derived split (11 + 11 + 10 layers) leaves dp 8; SMALL's pp 1, 2, 4 dp 6 to 24.
    ("llama3-8b", 56, 512, (False, False)), ("gpt2-xl", 7, None, (False, False)),
    ("llama3-8b", 24, 512, (True, False)),
])
def test_any_valid_is_whether_the_enumeration_finds_a_layout(
        model: str, gpus: int, gbs: int | None, found: tuple[bool, bool]) -> None:
    from dataclasses import replace

    from autotune.search.space import any_valid

    spec = load_model(model)
    if gbs is not None:
        spec = replace(spec, global_batch_size=gbs)
    spaces = (load_space(), space_from_mapping(SMALL, "small"))
    assert tuple(any_valid(space, spec, cluster(gpus)) for space in spaces) == found
    assert tuple(bool(enumerate_space(space, spec, cluster(gpus)).valid)
                 for space in spaces) == found


def test_a_dimension_the_space_does_not_list_is_not_enumerated() -> None:
    """The default space lists no offload or fused cross entropy: they keep Layout's default
    in every layout and multiply no combination. Its `derive` pipeline split is one
    combination: never the embedding/loss split where pp divides the layers (llama3-8b's 32),
    the even split at pp 1."""
    from autotune.layouts.layout import LAYOUT_DEFAULTS, SEARCHED

    space = load_space()
    unlisted = [d for d in SEARCHED if d not in space.candidates]
    assert "offload_layers" in unlisted
    assert not {"first_stage_layers", "last_stage_layers", "embedding_loss_split"} & {*unlisted}
    summary = enumerate_space(space, load_model("llama3-8b"), cluster(64))
    assert summary.valid and summary.total == space.size()
    for s in summary.valid:
        assert all(getattr(s, d) == LAYOUT_DEFAULTS[d] for d in unlisted), s.describe()
        assert not s.embedding_loss_split, s.describe()
        assert s.pp > 1 or not s.uneven, s.describe()
