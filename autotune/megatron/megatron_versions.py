"""The megatron-core releases autotune supports and what differs between them: one table.

Each `MegatronVersion` row says, for one release (and the Megatron-LM tag of its training code),
what autotune's worker, export and reader must do differently from the row before it: config
fields removed or renamed, Megatron-LM flags renamed, deprecated or removed, defaults that
changed, rule changes, levers that exist only from that release on, the worker's patches that
release needs, and the Python, torch and Transformer Engine ranges its wheel declares. Code
elsewhere asks this table (`running()`, `for_version()`, `spell_args()`, `config_kwargs()`,
`call_kwargs()`) rather than comparing version strings itself.

The installed release is read once from the package metadata (importlib.metadata): the
orchestrator never imports torch or megatron-core to know it. Sources: the megatron-core wheels'
METADATA and config dataclasses, Megatron-LM's megatron/training/arguments.py at core_v0.16.1 and
core_v0.19.0 (its parser, built and listed by tools/megatron_names.py; the names are kept in
tests/data/megatron_versions/, which tests/test_megatron_versions.py holds this table against).
Pure: no torch, no megatron-core import.
"""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import ConfigError

__all__ = ["DEFAULT", "GET_BATCH_ON_THIS_CP_RANK", "V0_16", "V0_19", "VERSIONS",
           "ConfigChange", "DefaultChange", "FlagChange", "FlagFate", "Lever", "MegatronVersion",
           "TeGap", "call_kwargs", "config_kwargs", "for_version", "installed_version",
           "parse_version", "running", "spell_args", "supported"]

log = logging.getLogger(__name__)

PACKAGE = "megatron-core"


class FlagFate(enum.StrEnum):
    """What became of a Megatron-LM flag in a release."""

    RENAMED = "renamed"
    """The old spelling is gone; the new one means the same."""
    DEPRECATED = "deprecated"
    """Both spellings parse; the old one is forwarded to the new one (with a warning)."""
    REMOVED = "removed"
    """The flag is gone and had no effect before (ignored, or the default it set is now the
    only behaviour): dropped from a command for that release."""
    ADDED = "added"
    """New in the release: a command for an older release cannot carry it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagChange:
    """A Megatron-LM flag whose spelling a release changed."""

    old: str | None
    """The spelling of the releases before (None for an added flag)."""
    new: str | None
    """The spelling from this release on (None for a removed flag)."""
    fate: FlagFate
    note: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigChange:
    """A megatron-core config field (`cls.name`) the release removed or renamed."""

    cls: str
    old: str
    new: str | None = None
    """None: removed."""
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DefaultChange:
    """A config field's default that changed in the release, and whether it touches what
    autotune measures (a layout's speed and memory as the worker and the export run it)."""

    cls: str
    name: str
    old: str
    new: str
    matters: bool
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Lever:
    """A lever (a config field with its Megatron-LM flag) that exists from a release on, not yet
    one of autotune's layout dimensions."""

    name: str
    cls: str
    flag: str
    needs: str
    """What it needs to take effect (implementation, model)."""
    saves: str
    """What it changes: memory, time, or both."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TeGap:
    """A Transformer Engine release that lacks a name this megatron-core release imports from
    it: the import fails as a whole, and other code runs than with a TE that has the name."""

    te: str
    """The TE release checked."""
    module: str
    """The megatron-core module whose import falls back."""
    missing: str
    """The name it imports that the TE release lacks."""
    runs_instead: str
    """What runs in its place, in the worker (autotune.worker.build) and in Megatron-LM."""
    works: str
    """What the same TE still does with this release."""
    seen_in: str
    """The benchmark report that found it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronVersion:
    """One supported megatron-core release, relative to the row before it."""

    version: str
    megatron_lm_tag: str
    """Megatron-LM's git tag whose training code (arguments.py) the flags were read at."""
    requires_python: str
    torch: str
    transformer_engine: str
    """The Transformer Engine range the release declares ("" when it names TE without bounds)."""
    transformer_engine_checked: str
    """The newest TE version the release's code tests for (is_te_min_version)."""
    verified_on_gpu: str | None
    """The benchmark report that ran autotune's worker with this release, or None."""
    config_changes: tuple[ConfigChange, ...] = ()
    flag_changes: tuple[FlagChange, ...] = ()
    default_changes: tuple[DefaultChange, ...] = ()
    rule_changes: tuple[str, ...] = ()
    """Changes to megatron-core's validation of the fields autotune's layouts set."""
    new_levers: tuple[Lever, ...] = ()
    worker_patches: frozenset[str] = field(default_factory=frozenset)
    """Holes in this release that autotune.worker.build fills (by name; see build.PATCHES)."""
    call_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Keyword arguments a megatron-core function the worker calls needs from this release on
    (by its dotted name), with the value that keeps the earlier behaviour."""
    te_gaps: tuple[TeGap, ...] = ()
    """Known differences with a Transformer Engine release that imports but is not the full
    match for this one."""

    @property
    def key(self) -> tuple[int, ...]:
        return parse_version(self.version)

    @property
    def series(self) -> tuple[int, int]:
        major, minor, *_ = self.key
        return major, minor

    def pip_range(self) -> str:
        """The requirement that selects this release's series."""
        major, minor = self.series
        return f"{PACKAGE}>={self.version},<{major}.{minor + 1}"


GET_BATCH_ON_THIS_CP_RANK = "megatron.core.utils.get_batch_on_this_cp_rank"

V0_16 = MegatronVersion(
    version="0.16.1",
    megatron_lm_tag="core_v0.16.1",
    requires_python=">=3.10",
    torch=">=2.6.0",
    transformer_engine=">=2.9.0a0,<2.12.0",  # its dev extra
    transformer_engine_checked="2.10.0",
    verified_on_gpu="results/benchmarks/2026-11-23-h100-te-build-and-runs.md",
    worker_patches=frozenset({"moe_te_general_gemm_unbound", "mla_have_te_without_te"}),
)

V0_19 = MegatronVersion(
    version="0.19.2",
    megatron_lm_tag="core_v0.19.0",
    requires_python=">=3.12",
    torch=">=2.6.0",
    # The te extra names transformer-engine[core_cu13,pytorch] without bounds; its dev
    # environment pins a TransformerEngine commit (pyproject.toml, tool.uv.sources).
    transformer_engine="",
    transformer_engine_checked="2.14.0",
    verified_on_gpu=None,
    config_changes=(
        ConfigChange(cls="ModelParallelConfig", old="async_tensor_model_parallel_allreduce",
                     note="ignored since 0.10; removed with its flags"),
        ConfigChange(cls="ModelParallelConfig", old="moe_extended_tp",
                     note="replaced by expert_tensor_parallel_size"),
        ConfigChange(cls="TransformerConfig", old="moe_use_legacy_grouped_gemm",
                     note="the legacy GroupedMLP is gone; TEGroupedMLP only"),
        ConfigChange(cls="DistributedDataParallelConfig", old="preserve_fp32_weights",
                     note="removed"),
        ConfigChange(cls="OptimizerConfig", old="muon_use_nesterov", new="muon_nesterov"),
    ),
    flag_changes=(
        FlagChange(old="--muon-use-nesterov", new="--muon-nesterov", fate=FlagFate.RENAMED,
                   note="OptimizerConfig.muon_nesterov"),
        FlagChange(old="--inference-max-batch-size", new="--inference-max-requests",
                   fate=FlagFate.RENAMED, note="dest inference_max_requests"),
        FlagChange(old="--tokenizer-hf-use-fast", new=None, fate=FlagFate.REMOVED,
                   note="fast tokenizers are the default; --tokenizer-hf-no-use-fast opts out"),
        FlagChange(old="--tokenizer-hf-include-special-tokens", new=None,
                   fate=FlagFate.REMOVED,
                   note="the default; --tokenizer-hf-no-include-special-tokens opts out"),
        FlagChange(old="--cuda-graph-scope", new="--cuda-graph-modules",
                   fate=FlagFate.DEPRECATED, note="hidden; forwarded to the new flag"),
        FlagChange(old="--moe-deepep-num-sms", new="--moe-flex-dispatcher-num-sms",
                   fate=FlagFate.DEPRECATED, note="routed to moe_flex_dispatcher_num_sms"),
        FlagChange(old="--moe-hybridep-num-sms", new="--moe-flex-dispatcher-num-sms",
                   fate=FlagFate.DEPRECATED, note="routed to moe_flex_dispatcher_num_sms"),
        FlagChange(old="--no-async-tensor-model-parallel-allreduce", new=None,
                   fate=FlagFate.REMOVED, note="ignored since 0.10 (its help said so)"),
        FlagChange(old="--disable-async-tensor-model-parallel-allreduce", new=None,
                   fate=FlagFate.REMOVED, note="ignored since 0.10"),
        FlagChange(old="--moe-extended-tp", new=None, fate=FlagFate.REMOVED,
                   note="ignored since 0.10; expert_tensor_parallel_size replaces it"),
        FlagChange(old=None, new="--fused-residual-rmsnorm", fate=FlagFate.ADDED,
                   note="TransformerConfig.fused_residual_rmsnorm"),
        FlagChange(old=None, new="--mlp-chunks-for-training", fate=FlagFate.ADDED,
                   note="TransformerConfig.mlp_chunks_for_training"),
        FlagChange(old=None, new="--activation-offload-fraction", fate=FlagFate.ADDED,
                   note="TransformerConfig.activation_offload_fraction"),
        FlagChange(old=None, new="--use-transformer-engine-op-fuser", fate=FlagFate.ADDED,
                   note="TransformerConfig.use_transformer_engine_op_fuser"),
    ),
    default_changes=(
        DefaultChange(cls="TransformerConfig", name="cuda_graph_scope", old="'full'",
                      new="None", matters=False,
                      why="CUDA graphs stay off (cuda_graph_impl 'none') in the worker and "
                          "the export"),
        DefaultChange(cls="TransformerConfig", name="cuda_graph_use_single_mempool",
                      old="False", new="True", matters=False, why="CUDA graphs stay off"),
        DefaultChange(cls="TransformerConfig", name="moe_deepep_num_sms", old="20",
                      new="None", matters=False,
                      why="the flex dispatcher (DeepEP) is not used: alltoall or allgather"),
        DefaultChange(cls="TransformerConfig", name="moe_hybridep_num_sms", old="16",
                      new="None", matters=False, why="HybridEP is not used"),
    ),
    rule_changes=(
        "TransformerConfig.__post_init__ adds checks only for fields autotune leaves at their "
        "defaults (fine-grained offload modules, paged stash, MuP, DSA, TE op fuser); the "
        "checks of tp/pp/vpp/cp/ep, the uneven split, recompute and layer offload are "
        "unchanged (tools/rules_crosscheck.py runs the layouts through 0.19's own "
        "validation on a Python 3.12 machine)",
        "Without Transformer Engine, utils.get_te_version reads TE's version as 0.0.0 where "
        "0.16.1 returned None: a config check that asks for a TE version (MoE with FP8, FP8 "
        "recompute of moe_act or layernorm) now fails with a ValueError naming the version "
        "instead of a TypeError, and OptimizerConfig accepts the precision-aware optimizer with "
        "the optimizer's CPU offload (it skips the TE-only store_param_remainders); autotune "
        "still asks impl te for it (rule pao_te), and tools/rules_crosscheck.py takes either "
        "failure as no verdict on a machine without TE",
    ),
    call_kwargs={
        # A new positional parameter without a default; False with no cu_seqlens in the batch
        # is the per-sequence zigzag split of 0.16.1 (pretrain_gpt.py passes it the same way).
        # 0.19 also takes the CP size and rank from cp_group alone (None: the whole world,
        # where 0.16.1 asked parallel_state), so the worker passes the group in every release.
        GET_BATCH_ON_THIS_CP_RANK: {"is_hybrid_cp": False},
    },
    te_gaps=(
        TeGap(te="2.11.0", module="megatron.core.optimizer.clip_grads",
              missing="transformer_engine.pytorch.optimizers.multi_tensor_scale_tensor",
              runs_instead="the gradient norm and the clip's scale run without TE's fused "
                           "kernels: megatron-core warns 'Transformer Engine and Apex are not "
                           "installed' and takes its Python fallback, which autotune's worker "
                           "replaces with torch foreach kernels (build._use_foreach_multi_tensor"
                           "_ops; result.json code_paths.grad_clip 'foreach'); under 0.16.1 "
                           "the same TE runs its own kernels. Its cost is not measured",
              works="TE's extension imports, its layer spec builds, FP8 works, te and fp8 "
                    "trials run; optimizer.py's multi_tensor_scale (the main-param copy) "
                    "still comes from TE",
              seen_in="results/benchmarks/2026-11-28-h100-issue29-s13.md"),
    ),
    new_levers=(
        Lever(name="fused_residual_rmsnorm", cls="TransformerConfig",
              flag="--fused-residual-rmsnorm", needs="impl te and RMSNorm",
              saves="time: the residual add fused into RMSNorm's backward"),
        Lever(name="mlp_chunks_for_training", cls="TransformerConfig",
              flag="--mlp-chunks-for-training", needs="any impl",
              saves="memory: the MLP's activations computed in sequence chunks"),
        Lever(name="activation_offload_fraction", cls="TransformerConfig",
              flag="--activation-offload-fraction",
              needs="fine-grained activation offloading (--offload-modules)",
              saves="memory, for the host copies' time"),
        Lever(name="use_transformer_engine_op_fuser", cls="TransformerConfig",
              flag="--use-transformer-engine-op-fuser", needs="impl te",
              saves="time: Transformer Engine's operation fuser"),
    ),
)

VERSIONS: tuple[MegatronVersion, ...] = (V0_16, V0_19)
"""Oldest first; each row's changes are relative to the row before."""

DEFAULT = V0_16
"""The release the worker is written against and the CPU CI runs (Python 3.11): what export
writes for when no megatron-core is installed and no --megatron-version is given."""


@functools.cache  # pure, and asked for each row's key whenever a command is spelled
def parse_version(text: str) -> tuple[int, ...]:
    """`0.19.2`, `0.16.1rc0`, `0.19.0+abc` -> (0, 19, 2) ... (the release numbers)."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise ConfigError(f"megatron-core version {text!r} is not a version number "
                          "(MAJOR.MINOR[.PATCH])")
    return tuple(int(part) for part in match.groups(default="0"))


@functools.cache  # once per version: the run key asks for every layout of a space
def for_version(text: str) -> MegatronVersion:
    """The table's row for a megatron-core version: the row of its series (0.19.x -> 0.19.2),
    else the newest older row, with a warning (a series between two rows, or newer than all:
    the nearest older row's differences are the best known); older than every row: refused."""
    key = parse_version(text)
    older = [v for v in VERSIONS if v.series <= key[:2]]
    if not older:
        raise ConfigError(f"megatron-core {text} is older than autotune supports (from "
                          f"{VERSIONS[0].version}; supported: {supported()})")
    row = older[-1]
    if row.series != key[:2]:
        log.warning("megatron-core %s is not in autotune's version table (%s); using %s's "
                    "differences", text, supported(), row.version)
    return row


def supported() -> str:
    return ", ".join(f"{v.series[0]}.{v.series[1]}.x" for v in VERSIONS)


@functools.cache
def installed_version() -> str | None:
    """The installed megatron-core's version from its metadata (no import), or None."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def running(requested: str | None = None) -> MegatronVersion:
    """The row to use: `requested` (--megatron-version), else the installed release, else
    DEFAULT."""
    # An empty --megatron-version (an unset variable) is refused, not taken for the default.
    text = requested if requested is not None else installed_version()
    return DEFAULT if text is None else for_version(text)


@dataclass(frozen=True, slots=True)
class _Spellings:
    """What spelling a command for one release means, flag by flag (`_spellings`)."""

    forward: Mapping[str, FlagChange]
    """A spelling of an older release -> its change up to this release (renamed, deprecated,
    removed)."""
    backward: Mapping[str, Sequence[FlagChange]]
    """A spelling of a newer release -> the changes that made it (added, or renamed from)."""
    changed: frozenset[str]
    """Every spelling either maps: a command without any is spelled right already."""


@functools.cache  # per release (by its key: a row holds dicts, so it cannot be hashed); the
# identity of a run (autotune.megatron.identity) spells the command of every layout of a space
def _spellings(key: tuple[int, ...]) -> _Spellings:
    forward = {c.old: c for row in VERSIONS if row.key <= key
               for c in row.flag_changes if c.old is not None}
    backward: dict[str, list[FlagChange]] = {}
    for row in VERSIONS:
        if row.key > key:
            for c in row.flag_changes:
                if c.new is not None:
                    backward.setdefault(c.new, []).append(c)
    return _Spellings(forward=forward, backward={k: tuple(v) for k, v in backward.items()},
                      changed=frozenset(forward) | frozenset(backward))


def spell_args(args: Sequence[str], version: MegatronVersion) -> list[str]:
    """`args` (written for any supported release) with each flag in `version`'s spelling:
    renamed and deprecated flags take the spelling of the target, flags removed as no-ops are
    dropped (with their value, when the next word is not a flag), and a flag the target does
    not have yet, or that merged several older flags, is refused."""
    spellings = _spellings(version.key)
    if spellings.changed.isdisjoint(arg.partition("=")[0] for arg in args):
        return list(args)  # the common case: autotune's own flags, the same in every release
    forward, backward = spellings.forward, spellings.backward
    out: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("--"):
                continue
        if not arg.startswith("--"):
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        change = forward.get(name)
        if change is not None and change.fate == FlagFate.REMOVED:
            skip_value = not eq
            continue
        if change is not None and change.new is not None:
            name = change.new
        backs = backward.get(name, ())
        if len(backs) > 1:
            raise ConfigError(f"{name} was {' or '.join(str(b.old) for b in backs)} before "
                              f"megatron-core {_row_of(backs[0]).version}; write the one "
                              f"for {version.version} yourself")
        if backs:
            if backs[0].old is None:
                raise ConfigError(f"{name} needs megatron-core >= {_row_of(backs[0]).version}; "
                                  f"the command is for {version.version}")
            name = backs[0].old
        out.append(name + eq + value)
    return out


def _row_of(change: FlagChange) -> MegatronVersion:
    return next(v for v in VERSIONS if change in v.flag_changes)


def call_kwargs(function: str, version: MegatronVersion) -> dict[str, Any]:
    """The keyword arguments `function` (a dotted name) needs in `version`, gathered from every
    row up to it."""
    out: dict[str, Any] = {}
    for row in VERSIONS:
        if row.key <= version.key:
            out.update(row.call_kwargs.get(function, {}))
    return out


_INHERITS: dict[str, tuple[str, ...]] = {"TransformerConfig": ("ModelParallelConfig",)}
"""TransformerConfig is a ModelParallelConfig: its keyword arguments include the parent's."""


def config_kwargs(cls: str, kwargs: Mapping[str, Any],
                  version: MegatronVersion) -> dict[str, Any]:
    """A config class's keyword arguments for `version`: renamed fields under their name in
    that release; a field the release removed is refused with the table's note."""
    out = dict(kwargs)
    classes = {cls, *_INHERITS.get(cls, ())}
    for row in VERSIONS:
        for c in row.config_changes:
            if c.cls not in classes or (c.old not in out and c.new not in out):
                continue
            if row.key <= version.key:
                if c.new is None:
                    raise ConfigError(f"{cls}.{c.old} is gone in megatron-core "
                                      f"{row.version} ({c.note}); the worker cannot set it")
                if c.old in out:
                    out[c.new] = out.pop(c.old)
            elif c.new is not None and c.new in out:
                out[c.old] = out.pop(c.new)
    return out
