"""The version table (autotune.megatron.megatron_versions) held against each release's own names.

tests/data/megatron_versions/<version>.json holds, per supported release, the option strings of
Megatron-LM's parser at the release's tag and the fields (with their defaults as written) of
megatron-core's config dataclasses, with the wheel's declared requirements; tools/
megatron_names.py wrote them (its "provenance" key says from what). The release the CPU CI
installs (0.16.1) is also checked against the installed package itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import known_flags, megatron_lm_args
from autotune.megatron.megatron_versions import (
    DEFAULT,
    GET_BATCH_ON_THIS_CP_RANK,
    V0_16,
    V0_19,
    VERSIONS,
    FlagFate,
    MegatronVersion,
    call_kwargs,
    config_kwargs,
    for_version,
    installed_version,
    parse_version,
    running,
    spell_args,
)
from autotune.report.scripts import megatron_lm_script
from autotune.specs.presets import load_model

DATA = Path(__file__).parent / "data" / "megatron_versions"
ROOT = Path(__file__).parent.parent


@cache
def names(version: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{version}.json").read_text())
    return data


def flags(row: MegatronVersion) -> set[str]:
    return set(names(row.version)["flags"])


def fields(row: MegatronVersion, cls: str) -> dict[str, str]:
    out: dict[str, str] = names(row.version)["fields"][cls]
    if cls == "TransformerConfig":  # a ModelParallelConfig
        out = {**names(row.version)["fields"]["ModelParallelConfig"], **out}
    return out


def previous(row: MegatronVersion) -> MegatronVersion:
    return VERSIONS[VERSIONS.index(row) - 1]


LATER = VERSIONS[1:]


def test_every_row_has_its_names_and_rows_are_ordered() -> None:
    assert [v.key for v in VERSIONS] == sorted(v.key for v in VERSIONS)
    for row in VERSIONS:
        data = names(row.version)
        assert data["version"] == row.version
        assert row.megatron_lm_tag in data["provenance"]


def _declared_te(row: MegatronVersion) -> str:
    from packaging.requirements import Requirement

    (te,) = names(row.version)["transformer_engine"]
    return str(Requirement(te).specifier)


@pytest.mark.parametrize("row", VERSIONS, ids=lambda v: v.version)
def test_declared_ranges_are_the_wheels(row: MegatronVersion) -> None:
    from packaging.specifiers import SpecifierSet

    data = names(row.version)
    assert data["requires_python"] == row.requires_python
    assert data["torch"] == f"torch{row.torch}"
    assert SpecifierSet(_declared_te(row)) == SpecifierSet(row.transformer_engine)


CHANGES = [(row, c) for row in LATER for c in row.flag_changes]


@pytest.mark.parametrize(("row", "change"), CHANGES,
                         ids=[f"{r.version}:{c.old or c.new}" for r, c in CHANGES])
def test_flag_changes_hold_in_both_parsers(row: MegatronVersion, change: Any) -> None:
    before, after = flags(previous(row)), flags(row)
    if change.fate == FlagFate.RENAMED:
        assert change.old in before and change.old not in after and change.new in after
    elif change.fate == FlagFate.DEPRECATED:
        assert change.old in before and change.old in after and change.new in after
        assert change.new not in before
    elif change.fate == FlagFate.REMOVED:
        assert change.old in before and change.old not in after and change.new is None
    else:
        assert change.fate == FlagFate.ADDED
        assert change.new in after and change.new not in before and change.old is None


CONFIG = [(row, c) for row in LATER for c in row.config_changes]


@pytest.mark.parametrize(("row", "change"), CONFIG,
                         ids=[f"{r.version}:{c.cls}.{c.old}" for r, c in CONFIG])
def test_config_changes_hold_in_both_releases(row: MegatronVersion, change: Any) -> None:
    assert change.old in fields(previous(row), change.cls)
    assert change.old not in fields(row, change.cls)
    if change.new is not None:
        assert change.new in fields(row, change.cls)


DEFAULTS = [(row, c) for row in LATER for c in row.default_changes]


@pytest.mark.parametrize(("row", "change"), DEFAULTS,
                         ids=[f"{r.version}:{c.name}" for r, c in DEFAULTS])
def test_default_changes_hold_in_both_releases(row: MegatronVersion, change: Any) -> None:
    assert fields(previous(row), change.cls)[change.name] == change.old
    assert fields(row, change.cls)[change.name] == change.new


def test_no_other_default_changed_for_a_field_the_worker_sets() -> None:
    """A default that changed under a field the worker leaves unset would change what a trial
    measures without the worker's configuration showing it; the table must list each one."""
    listed = {(c.cls, c.name) for row in LATER for c in row.default_changes}
    for row in LATER:
        for cls in ("TransformerConfig", "DistributedDataParallelConfig", "OptimizerConfig"):
            old, new = fields(previous(row), cls), fields(row, cls)
            changed = {(cls, k) for k in old.keys() & new.keys() if old[k] != new[k]}
            assert changed <= listed, changed - listed


LEVERS = [(row, lever) for row in LATER for lever in row.new_levers]


@pytest.mark.parametrize("row", VERSIONS, ids=lambda v: v.version)
def test_te_gaps_are_on_record(row: MegatronVersion) -> None:
    """A Transformer Engine gap cites the run that found it, within the TE the release checks."""
    for gap in row.te_gaps:
        assert (ROOT / gap.seen_in).is_file()
        assert gap.module.startswith("megatron.core.")
        assert gap.missing.startswith("transformer_engine.")
        assert parse_version(gap.te) <= parse_version(row.transformer_engine_checked)


@pytest.mark.parametrize(("row", "lever"), LEVERS,
                         ids=[f"{r.version}:{lv.name}" for r, lv in LEVERS])
def test_new_levers_exist_only_from_their_release(row: MegatronVersion, lever: Any) -> None:
    assert lever.name in fields(row, lever.cls) and lever.flag in flags(row)
    assert lever.name not in fields(previous(row), lever.cls)
    assert lever.flag not in flags(previous(row))


@pytest.mark.parametrize("row", VERSIONS, ids=lambda v: v.version)
def test_every_flag_autotune_writes_or_reads_exists_in_every_release(
        row: MegatronVersion) -> None:
    missing = sorted(set(known_flags()) - flags(row))
    assert not missing, f"Megatron-LM {row.megatron_lm_tag} has no {missing}"


def test_no_flag_autotune_reads_changed_spelling() -> None:
    """--from-megatron reads a command of any supported release with the one FLAG_TABLE: that
    holds while none of its flags has another spelling in the table. A row that renames one
    needs the old spelling read as the new (FLAG_TABLE's Flag rows) before this passes."""
    touched = {name for row in VERSIONS for c in row.flag_changes for name in (c.old, c.new)}
    assert not touched & set(known_flags())


MODELS = ["gpt2-xl", "llama3-8b", "mixtral-8x7b"]
LAYOUTS: list[dict[str, Any]] = [
    {}, {"tp": 2, "sequence_parallel": True}, {"pp": 2, "vpp": 2},
    {"recompute": "full", "recompute_num_layers": 1},
    {"recompute": "selective"}, {"distributed_optimizer": True, "overlap_grad_reduce": True,
                                 "overlap_param_gather": True},
    {"impl": "te", "offload_layers": 2}, {"cross_entropy_fusion": True},
]


@pytest.mark.parametrize("row", VERSIONS, ids=lambda v: v.version)
@pytest.mark.parametrize("model_name", MODELS)
def test_worker_config_fields_exist_in_every_release(row: MegatronVersion,
                                                     model_name: str) -> None:
    model = load_model(model_name)
    for extra in LAYOUTS:
        layout = Layout(dp=1, gbs=model.global_batch_size, **extra)
        wanted = core_config(model, layout)
        for cls, kwargs in (("TransformerConfig", wanted.transformer),
                            ("DistributedDataParallelConfig", wanted.ddp),
                            ("OptimizerConfig", wanted.optimizer)):
            given = config_kwargs(cls, kwargs, row)
            assert set(given) <= set(fields(row, cls)), (cls, set(given) - set(fields(row, cls)))


def test_installed_release_is_the_one_named() -> None:
    """The fixture of the release the CI installs matches the installed dataclasses."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    version = installed_version()
    assert version is not None
    row = for_version(version)
    if row.version != version:
        pytest.skip(f"installed megatron-core {version} has no fixture of its own")
    for cls in (ModelParallelConfig, TransformerConfig, DistributedDataParallelConfig,
                OptimizerConfig):
        own = set(names(row.version)["fields"][cls.__name__])
        assert {f.name for f in dataclasses.fields(cls)} >= own


def test_worker_patches_are_the_builds() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autotune.worker.build import PATCHES

    assert set().union(*(v.worker_patches for v in VERSIONS)) == set(PATCHES)


@pytest.mark.parametrize(("text", "expected", "warns"), [
    ("0.16.1", "0.16.1", False), ("0.16.0", "0.16.1", False), ("0.19.0", "0.19.2", False),
    ("0.19.2", "0.19.2", False), ("0.19.3rc1", "0.19.2", False),
    ("0.17.1", "0.16.1", True), ("0.18.2", "0.16.1", True), ("0.20.0", "0.19.2", True),
])
def test_for_version(text: str, expected: str, warns: bool,
                     caplog: pytest.LogCaptureFixture) -> None:
    for_version.cache_clear()
    with caplog.at_level(logging.WARNING, logger="autotune.megatron.megatron_versions"):
        assert for_version(text).version == expected
        assert for_version(text).version == expected
    assert len(caplog.records) == warns  # once per version, however often it is asked


@pytest.mark.parametrize("text", ["0.15.3", "abc", ""])
def test_for_version_refuses(text: str) -> None:
    with pytest.raises(ConfigError):
        for_version(text)


@pytest.mark.parametrize(("requested", "installed", "expected"), [
    (None, None, DEFAULT.version), (None, "0.19.2", "0.19.2"), ("0.19.1", "0.16.1", "0.19.2"),
    ("0.16", None, "0.16.1"),
])
def test_running(monkeypatch: pytest.MonkeyPatch, requested: str | None,
                 installed: str | None, expected: str) -> None:
    import autotune.megatron.megatron_versions as mv

    monkeypatch.setattr(mv, "installed_version", lambda: installed)
    assert running(requested).version == expected


@pytest.mark.parametrize(("args", "to", "expected"), [
    (["--moe-deepep-num-sms", "20"], V0_19, ["--moe-flex-dispatcher-num-sms", "20"]),
    (["--no-async-tensor-model-parallel-allreduce", "--bf16"], V0_19, ["--bf16"]),
    (["--tokenizer-hf-use-fast", "--lr", "1e-4"], V0_19, ["--lr", "1e-4"]),
    (["--muon-use-nesterov"], V0_19, ["--muon-nesterov"]),
    (["--muon-nesterov"], V0_16, ["--muon-use-nesterov"]),
    (["--cuda-graph-modules=attn", "mlp"], V0_16, ["--cuda-graph-scope=attn", "mlp"]),
    (["--inference-max-batch-size", "8"], V0_19, ["--inference-max-requests", "8"]),
    (["--muon-use-nesterov", "--bf16"], V0_16, ["--muon-use-nesterov", "--bf16"]),
])
def test_spell_args(args: list[str], to: MegatronVersion, expected: list[str]) -> None:
    assert spell_args(args, to) == expected
    assert {a.split("=")[0] for a in expected if a.startswith("--")} <= flags(to)


@pytest.mark.parametrize("lever", V0_19.new_levers, ids=lambda lv: lv.name)
def test_spell_args_refuses_a_flag_the_release_lacks(lever: Any) -> None:
    with pytest.raises(ConfigError, match=r"0\.19\.2"):
        spell_args([lever.flag], V0_16)
    assert spell_args([lever.flag], V0_19) == [lever.flag]


def test_spell_args_refuses_a_merged_flag_for_an_older_release() -> None:
    # 0.19 merged --moe-deepep-num-sms and --moe-hybridep-num-sms: which one 0.16 needs
    # depends on the dispatcher backend.
    with pytest.raises(ConfigError, match="--moe-deepep-num-sms or --moe-hybridep-num-sms"):
        spell_args(["--moe-flex-dispatcher-num-sms", "20"], V0_16)


@pytest.mark.parametrize(("cls", "kwargs", "to", "expected"), [
    ("OptimizerConfig", {"muon_use_nesterov": True, "lr": 1.0}, V0_19,
     {"muon_nesterov": True, "lr": 1.0}),
    ("OptimizerConfig", {"muon_nesterov": True}, V0_16, {"muon_use_nesterov": True}),
    ("TransformerConfig", {"moe_use_legacy_grouped_gemm": False}, V0_16,
     {"moe_use_legacy_grouped_gemm": False}),
])
def test_config_kwargs(cls: str, kwargs: dict[str, Any], to: MegatronVersion,
                       expected: dict[str, Any]) -> None:
    assert config_kwargs(cls, kwargs, to) == expected


@pytest.mark.parametrize(("cls", "name"), [
    ("TransformerConfig", "moe_use_legacy_grouped_gemm"),
    ("TransformerConfig", "async_tensor_model_parallel_allreduce"),  # ModelParallelConfig's
    ("DistributedDataParallelConfig", "preserve_fp32_weights"),
])
def test_config_kwargs_refuses_a_removed_field(cls: str, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        config_kwargs(cls, {name: False}, V0_19)


@pytest.mark.parametrize("model_name", MODELS)
def test_export_writes_each_releases_flags(model_name: str) -> None:
    model = load_model(model_name)
    layout = Layout(dp=8, gbs=model.global_batch_size, distributed_optimizer=True)
    for row in VERSIONS:
        args = megatron_lm_args(model, layout, megatron_version=row)
        assert {a for a in args if a.startswith("--")} <= flags(row)
        text = megatron_lm_script(model, layout, title=["t"], megatron_version=row)
        assert f"Megatron-LM {row.megatron_lm_tag}" in text


def test_pyproject_extras_declare_the_tables_ranges() -> None:
    from packaging.requirements import Requirement
    from packaging.version import Version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    (core,) = [Requirement(r) for r in extras["megatron"] if r.startswith("megatron-core")]
    for row in VERSIONS:
        assert Version(row.version) in core.specifier
        assert Version(f"{row.series[0]}.{row.series[1]}.9") in core.specifier
    for outside in ("0.15.3", "0.17.1", "0.18.2", "0.20.0"):
        assert Version(outside) not in core.specifier
    te = [Requirement(r) for r in extras["te"]]
    for row in VERSIONS:
        python = row.requires_python.removeprefix(">=")
        (chosen,) = [r for r in te if r.marker is None or r.marker.evaluate(
            {"python_version": python if row is VERSIONS[-1] else "3.11"})]
        declared = Requirement(f"x{row.transformer_engine}").specifier
        for te_version in ("2.8.0", "2.9.0", "2.11.0", "2.12.0", "2.14.0"):
            assert (Version(te_version) in chosen.specifier) == (
                Version(te_version) in declared), (row.version, te_version)


@pytest.mark.parametrize(("row", "expected"), [(V0_16, {}), (V0_19, {"is_hybrid_cp": False})],
                         ids=["0.16.1", "0.19.2"])
def test_call_kwargs(row: MegatronVersion, expected: dict[str, Any]) -> None:
    assert call_kwargs(GET_BATCH_ON_THIS_CP_RANK, row) == expected


def test_call_kwargs_bind_to_the_installed_functions() -> None:
    """The worker's calls, with the installed release's keyword arguments, fit its signatures."""
    import importlib
    import inspect

    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    version = installed_version()
    assert version is not None
    row = for_version(version)
    for name in {name for v in VERSIONS for name in v.call_kwargs}:
        module, _, function = name.rpartition(".")
        signature = inspect.signature(getattr(importlib.import_module(module), function))
        signature.bind({}, **call_kwargs(name, row), cp_group=None)
