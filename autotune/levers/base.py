"""What a lever declares: its rules, flag rows, core-config keys, memory and cost terms, seed role.

A lever is one piece of Megatron knowledge that a layout may turn (the distributed optimizer,
the overlap flags, the fused cross entropy, ...). Its module under autotune/levers/ holds all of
it in one place, and the consumers iterate `autotune.levers.LEVERS` instead of keeping a list of
their own:

- its Layout fields: a frozen kw_only dataclass mixin (`Fields`, `__slots__ = ()`) whose fields
  are declared with `dimensions.dimension(...)`; `autotune.levers.LeverFields` joins the mixins
  and `autotune.layouts.layout.Layout` inherits it, so the fields are typed like any other;
- `rules` (autotune.layouts.layout.RULES) and `requires` (a field that must hold a value whenever
  the lever is on: a rule as data, which identity's same-run rule and the seeds respect);
- `flag_rows` (autotune.megatron.megatron_args.FLAG_TABLE: the Megatron-LM flags, emitted and read
  back), spliced in at its `flag_place` (beside the core rows of its subject);
- `core_config`: its keys for megatron-core's TransformerConfig, DistributedDataParallelConfig and
  OptimizerConfig, and the GPT model's build (the layer spec) (autotune.megatron.core_config);
- `memory`: how it changes a rank's model states and the sizes its layers' activations are
  counted in (`MemoryState`, autotune.predict.memory), and `cost`: how it changes a step's terms
  (`CostState`, autotune.predict.cost). Each is a pure function of the layout applied in registry
  order, so a lever that reshapes the optimizer state (the distributed optimizer, lower
  precision) comes before one that moves it (CPU offload);
- `activations`: what one pipeline chunk keeps of its layers' activations for a micro-batch
  (`ActivationState`: stored and workspace bytes), and `stage_cost`: what a stage's
  micro-batch adds to its layers' time (`StageState`: recomputed forwards, checkpoints,
  offload copies). Both run after every lever's `memory` / `cost` term, once the layers'
  activations and times are known (they depend on the implementation and FP8's sizes);
- `seed`: its part in Alpa's seeds (autotune.search.heuristics): the value Megatron practice starts
  from, or a memory saving the seeds may spend on a larger micro-batch (and the `fallback`
  savings spent in order where no cost model ranks them);
- `derivable`: counts that a space may mark `derive`, resolved from the memory model
  (autotune.search.derive);
- `constants`: a dataclass mixin of its cost constants, joined into
  autotune.predict.cost.CostParams (through `autotune.levers.LeverConstants`) so that calibration
  can fit them (where a layout turns the lever, or always: `calibrated`).

tests/test_dimension_contract.py checks every registered lever against this contract
(`contract_problems`) and against megatron-core's own configuration classes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.levers.flags import FlagRow, Given, Place

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams, LayerTimes
    from autotune.specs.activations import LayerActivations
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["CONFIG_PARTS", "ActivationState", "AttentionBytes", "CoreConfigTerm", "CostState",
           "Derivable", "Lever", "MemoryState", "Requires", "Rule", "Seed", "StageState",
           "Unread", "contract_problems", "evolve", "satisfy"]


Check = Callable[["Layout", "ModelSpec", "ClusterSpec"], "str | None"]


@dataclass(frozen=True, slots=True)
class Rule:
    """A named check; `level` is the deepest enumeration level whose fields it reads."""

    name: str
    level: int
    summary: str
    check: Check


@dataclass(frozen=True, slots=True, kw_only=True)
class Requires:
    """Megatron refuses the layout unless each field of `needs` has its value whenever `when`
    holds: a rule as data. `rule()` checks it; identity's same-run normalisation keeps such a
    field (one data-parallel rank does not make the distributed optimizer optional where the
    precision-aware optimizer asserts it), and the seeds count it as practice."""

    name: str
    level: int
    summary: str
    needs: tuple[tuple[str, Any], ...]
    when: Callable[[Layout], bool]
    message: Callable[[Layout, str], str]
    """The rule's message for the first unmet field, with the layout's values."""

    def unmet(self, s: Layout) -> list[str]:
        if not self.when(s):
            return []
        return [name for name, value in self.needs if getattr(s, name) != value]

    def rule(self) -> Rule:
        def check(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
            unmet = self.unmet(s)
            return self.message(s, unmet[0]) if unmet else None
        return Rule(self.name, self.level, self.summary, check)


@dataclass(frozen=True, slots=True, kw_only=True)
class Unread:
    """A field of which Megatron receives nothing (no Megatron-LM flag, no core-config key)
    while `when` holds: layouts that differ only there are one run. autotune.megatron.identity
    builds the run key from the fields with these set to their defaults, instead of building
    each layout's whole configuration; tests/test_identity.py holds that key to the
    configuration's grouping."""

    name: str
    when: Callable[[Layout], bool]
    reason: str
    """Where Megatron leaves it unread (cited)."""
    flags: tuple[str, ...] = ()
    """The Megatron-LM flags that set it: a user's command that gives one while `when` holds
    is told that it changes nothing (autotune.megatron.megatron_command.ignored_warning)."""


CONFIG_PARTS = ("transformer", "ddp", "optimizer", "model")
"""The core-config parts a lever may add keys to: megatron-core's TransformerConfig,
DistributedDataParallelConfig and OptimizerConfig keyword arguments, and the GPT model's build
(`layer_spec`, which autotune.worker.build turns into a layer spec)
(autotune.megatron.core_config)."""

CoreConfigTerm = Callable[["ModelSpec", "Layout"], dict[str, dict[str, Any]]]
"""(model, layout) -> {part: {keyword: value}} for parts among CONFIG_PARTS. dtypes by name
("bfloat16"), as the rest of the core config: autotune.worker.build resolves every
`*_dtype` key."""


@dataclass(frozen=True, slots=True)
class AttentionBytes:
    """What core attention keeps of one layer, per rank, by how its kernels run: set by the
    transformer implementation (autotune.levers.transformer_impl) and read by
    autotune.specs.activations.layer_activations."""

    saved_per_score: float = 0.0
    """Bytes per attention score and head saved for backward (an unfused softmax's output,
    dropout mask and dropout output; none where a fused kernel recomputes them)."""
    workspace_per_score: float = 0.0
    """Bytes per attention score and head alive while one layer's forward runs, beyond what it
    saves."""
    saved_per_head: float = 0.0
    """Bytes per token and head saved for backward besides the scores (a fused kernel's fp32
    log-sum-exp)."""
    qkv_as_given: bool = False
    """Whether the kernel's backward keeps query, key and value as megatron-core hands them
    over: views of the QKV GEMM's output where its split leaves them, each key/value group
    repeated for its heads first with GQA (the local DotProductAttention and autotune's
    SdpaAttention). False: Transformer Engine's, which copies them into a layout of its own
    unless they already are one (autotune.specs.activations.qkv_extra)."""
    saves_output: bool = False
    """Whether the kernel saves its own output for backward (flash and cuDNN fused attention:
    TE 2.11 FusedAttnFunc saves q, k, v and `out`). In bf16 that tensor is the output
    projection's saved input too, counted once; where the projection saves a quantized copy of
    its own (FP8 delayed scaling) both stay (autotune.specs.activations.layer_activations); with
    the other FP8 recipes megatron-core has it save this tensor again (proj_saves_original)."""


@dataclass(frozen=True, kw_only=True)  # no slots: evolve copies the __dict__
class MemoryState:
    """What one rank of one pipeline stage keeps per parameter and per logit, before the levers
    change it (megatron-core's defaults with every lever off) and after, in registry order.
    autotune.predict.memory turns it into the StageMemory terms."""

    optimizer_bytes_per_param: float
    """GPU bytes of optimizer state per parameter of the local shard: fp32 master weights and
    Adam's two moments, 12 B (ZeRO Section 3.1, K = 12)."""
    host_bytes_per_param: float = 0.0
    """Host (CPU) bytes per parameter of the local shard (an offloaded optimizer)."""
    main_grad_bytes: float = 4.0
    """Bytes per parameter of the main-gradient buffer (autotune.predict.memory.MAIN_GRAD_BYTES:
    fp32, Megatron-LM's with --bf16; bf16 with autotune.levers.grad_reduce)."""
    step_bytes_per_param: float = 0.0
    """GPU bytes per local-shard parameter that live only from the optimizer step to the next
    step's zero_grad, when the micro-batches' activations are freed (the fp32 copy of bf16
    gradients): they set the peak only where they outweigh the activations."""
    step_group_bytes_per_param: float = 0.0
    """GPU bytes per parameter of the local shard's largest optimizer parameter group that live
    only while the optimizer steps that group (autotune.levers.precision_optimizer: FusedAdam's
    fp32 copies of bf16 moments, made and freed group by group). megatron-core groups the
    parameters by weight decay and by expert parallelism (optimizer/__init__.py
    _get_param_groups): the dense and the expert parameters apart."""
    dense_shard: int = 1
    """Ranks the dense parameters' optimizer state is sharded over."""
    expert_shard: int = 1
    """Ranks the expert parameters' optimizer state is sharded over."""
    logits_bytes_per_element: float = 6.0
    """Live bytes per logit (vocabulary entry x token) at the last stage's peak."""
    linear_weight_bytes: float = 2.0
    """GPU bytes per weight of the transformer layers' GEMMs: the bf16 parameter
    (autotune.predict.memory.PARAM_BYTES) and any copy a lever keeps of it (TE's FP8 copies)."""
    linear_input_bytes: float = 2.0
    """Bytes per element of the inputs the layers' GEMMs save for backward (bf16; TE's FP8
    keeps them in 1 byte and its scales)."""
    attention: AttentionBytes = AttentionBytes()
    """What core attention saves and needs per score (the transformer implementation's)."""
    proj_saves_original: bool = False
    """The attention output projection saves its bf16 input, not a quantized copy (FP8 with a
    recipe other than delayed: autotune.levers.fp8, autotune.specs.activations)."""
    stage_layers: tuple[int, ...] = ()
    """Transformer layers on each pipeline stage, first to last: an even split
    (autotune.levers.pipeline_split.even_layers) unless the pipeline split says otherwise."""
    expandable_segments: bool = False
    """The caching allocator runs expandable segments (autotune.levers.allocator): the reserve
    beyond the allocated peak is MemoryParams.expandable_fragmentation's, not
    .fragmentation's."""


@dataclass(frozen=True, kw_only=True)  # no slots: evolve copies the __dict__
class ActivationState:
    """What one model chunk of a pipeline stage keeps of its layers' activations for one
    micro-batch: every layer's stored in full (`layers` x `layer_bytes`) before the levers
    change it, then as recompute and CPU offloading do, in registry order. autotune.predict.memory
    multiplies it by the micro-batches in flight."""

    layers: int
    """Transformer layers of the chunk."""
    layer: LayerActivations
    """Bytes per token one layer stores, by how they shard
    (autotune.specs.activations)."""
    tokens: float
    """Local tokens of one micro-batch (mbs x seq / cp)."""
    seq: float
    """Local sequence length (seq / cp)."""
    layer_bytes: float
    """One layer's activations stored in full for the micro-batch."""
    stored_bytes: float
    """The chunk's stored activations."""
    workspace_bytes: float
    """Transient bytes of one layer at a time: unfused attention's scores, a recomputed
    region being rebuilt."""
    block_margin: float = 1.0
    """Largest blocks the stage needs free beside its peak (autotune.predict.memory.BLOCK_MARGIN;
    none under full recompute)."""


@dataclass(frozen=True, kw_only=True)  # no slots: evolve copies the __dict__
class CostState:
    """The step's terms that levers change, before (every lever off) and after, in registry
    order; autotune.predict.cost computes the times from them."""

    cross_entropy_passes: int = 4
    """Passes over the fp32 logits in the vocab-parallel cross entropy (cross_entropy.py)."""
    dp_sharded: bool = False
    """Gradients reduce-scattered and parameters all-gathered (the distributed optimizer)
    instead of one all-reduce."""
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    dense_shard: int = 1
    """Ranks the dense parameters' optimizer step is split over."""
    expert_shard: int = 1
    optimizer_bytes_per_param: float
    """HBM traffic of the GPU's Adam step per local-shard parameter."""
    main_grad_bytes: float = 4.0
    """Bytes per parameter that the gradient reduction moves: the main-gradient buffer's dtype
    (MemoryState.main_grad_bytes)."""
    optimizer_host_s_per_param: float = 0.0
    """Seconds per local-shard parameter the step spends off the GPU (a CPU optimizer and its
    copies over the host link), on the critical path."""
    layer_gemm_speedup: float = 1.0
    """How many times faster than bf16 the transformer layers' GEMMs run (FP8); the output
    layer's GEMM is megatron-core's own and stays bf16."""
    layer_pass_bytes_per_token: float = 0.0
    """HBM bytes per local token of one layer, forward and backward, that a lever's memory-
    bound passes add (FP8's casts of GEMM inputs and output gradients)."""
    linear_weight_pass_bytes: float = 0.0
    """HBM bytes per GEMM weight of the stage that a lever's once-a-step pass moves (TE's FP8
    weight casts on a step's first micro-batch)."""
    linear_gather_bytes: float = 2.0
    """Bytes per GEMM weight the distributed optimizer all-gathers (bf16, autotune.predict.memory.
    PARAM_BYTES; FP8 parameters: 1)."""
    stage_layers: tuple[int, ...] = ()
    """Transformer layers on each pipeline stage, first to last: an even split
    (autotune.levers.pipeline_split.even_layers) unless the pipeline split says otherwise."""
    attention: AttentionBytes = AttentionBytes()
    """What core attention saves (the transformer implementation's): the activations whose
    element-wise passes and offload copies the step pays for."""
    attention_efficiency: float = 1.0
    """Fraction of the bf16 peak core attention's FLOPs run at (the implementation's kernel)."""
    attention_dropout_ops_per_score: float = 0.0
    """Integer instructions per computed attention score that a fused kernel spends on
    attention dropout's random numbers, each time it draws them (the forward, the backward's
    regeneration, a recomputed forward); 0 without dropout or with an unfused kernel, whose
    dropout is in attention_bytes_per_score."""
    attention_bytes_per_score: float = 0.0
    """HBM bytes per attention score and head, forward and backward, of an unfused attention's
    memory-bound kernels."""
    elementwise_bytes: float = 0.0
    """HBM bytes the layers' element-wise kernels move (forward and backward) per byte of
    stored activation (the implementation's fusions)."""
    layer_launch_extra_s: float = 0.0
    """Host time per layer and micro-batch beyond CostParams.layer_launch_s (TE's modules)."""
    layer_tp_extra_s: float = 0.0
    """Seconds per pass (forward, backward, recomputed forward) of one layer that a lever adds
    to the tensor-parallel collectives on its critical path (current scaling's amax
    all-reduces)."""
    layer_host_floor_s: float = 0.0
    """Host seconds per layer and micro-batch (forward and backward) that a path spends issuing
    its work (TE's FP8 quantizers): the layers take at least this long, however short their
    GPU work (autotune.predict.cost._stage_time)."""
    recompute_host_s: float = 0.0
    """Host seconds per recomputed layer forward and micro-batch that a path adds to the host
    floor beyond running that forward again (delayed scaling's state saved and restored around
    Transformer Engine's checkpoint: autotune.levers.fp8.Constants.fp8_delayed_recompute_host_s);
    counted where layer_host_floor_s is set."""


@dataclass(frozen=True, kw_only=True)  # no slots: evolve copies the __dict__
class StageState:
    """What one micro-batch of a pipeline stage of `layers` layers adds to its layers' forward
    and backward, before (nothing) and after the levers (recompute, CPU offloading), in
    registry order; autotune.predict.cost turns it into the stage's time."""

    layers: int
    """Transformer layers of the stage."""
    chunk: int
    """Transformer layers of one of its model chunks."""
    layer: LayerTimes
    """One layer's forward for one micro-batch, by term (autotune.predict.cost)."""
    mlp_forward_s: float
    """The MLP's (MoE layer's) GEMMs of `layer.gemm`."""
    mla_up_forward_s: float = 0.0
    """Multi-Latent Attention's up projections' GEMMs of `layer.gemm` (0 without MLA)."""
    activations: LayerActivations
    """What one layer stores per token (bf16 GEMM inputs: the element-wise kernels' bytes)."""
    tokens: float
    """Local tokens of one micro-batch."""
    layer_bytes: float
    """One layer's stored activations for the micro-batch."""
    hbm_bytes_per_s: float
    """HBM bandwidth the memory-bound kernels reach."""
    elementwise_bytes: float
    """CostState.elementwise_bytes."""
    recomputed_forwards: float = 0.0
    """Forwards per layer run again (full recompute: 1, or a block's share)."""
    attention_reruns: float = 0.0
    """Core-attention forwards per layer run again besides those (selective core_attn)."""
    rerun_s: float = 0.0
    """Seconds per layer of forwards run again besides those (selective recompute's modules)."""
    checkpoints: float = 0.0
    """Activation checkpoints per model chunk (CostParams.checkpoint_call_s each)."""
    offload_s: float = 0.0
    """Exposed seconds of host copies (CPU offloading)."""


MemoryTerm = Callable[["ModelSpec", "Layout", MemoryState], MemoryState]
ActivationTerm = Callable[["ModelSpec", "Layout", ActivationState], ActivationState]
CostTerm = Callable[["ModelSpec", "Layout", "ClusterSpec", "CostParams", CostState], CostState]
StageTerm = Callable[["ModelSpec", "Layout", "ClusterSpec", "CostParams", StageState],
                     StageState]


@dataclass(frozen=True, slots=True, kw_only=True)
class Derivable:
    """A count a space may mark `derive`: resolved from the memory model instead of listed
    (autotune.search.derive)."""

    name: str
    applies: Callable[[Layout, ModelSpec], bool]
    """Whether the value means anything for this layout (else it stays at its default)."""
    values: Callable[[Layout, ModelSpec], tuple[int, ...]]
    """The values Megatron accepts for this layout, in order of rising saving and cost."""
    monotone: Callable[[Layout], bool]
    """True for a layout where memory falls and time rises along `values` (the fewest that
    fit is the best); False where time is the same for every value (the least memory is the
    best)."""
    off: int
    """The value that means the lever is unused (its Layout default)."""
    rules: tuple[str, ...] = ()
    """The rules that read the count (of any level). Every value of `values` passes them where
    the lever applies, as `off` does where it does not: the enumeration checks its level's
    other rules first and resolves the count only for a layout they pass (a rule not named
    here gives the same answer whatever the count; tests/test_derive.py holds both)."""
    joint: Callable[[Layout, ModelSpec, frozenset[str]], tuple[dict[str, Any], ...]] | None = None
    """Where set, the count is one part of a choice of several fields (the pipeline split's
    first and last stage counts): the choices Megatron accepts for the layout with the fields
    `derived` free (the others as the layout holds them), each a {field: value} of every
    field of the choice. autotune.search.derive.joint_candidates keeps those of least
    predicted pace at the count's level (and the roomiest), and the enumeration takes the one
    of least predicted step time among them that fits at the complete layout (best_split),
    not the least memory."""


class Seed(enum.StrEnum):
    """A lever's part in Alpa's seeds (autotune.search.heuristics)."""

    PRACTICE = "practice"
    """Seeds start from the value `Lever.practice` gives (Megatron practice without tuning)."""
    MEMORY = "memory"
    """A memory saving: a seed may spend it to make a larger micro-batch fit (Alpa step 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Lever:
    """One lever's knowledge; see the module docstring."""

    name: str
    fields: type
    """The Layout mixin holding its fields."""
    rules: tuple[Rule, ...] = ()
    requires: tuple[Requires, ...] = ()
    flag_rows: tuple[FlagRow, ...]
    flag_place: Place = Place.OPTIONS
    """Where its rows sit in autotune.megatron.megatron_args.FLAG_TABLE (and an exported
    command)."""
    environment: Callable[[Layout], Mapping[str, str]] | None = None
    """For a lever that is a setting of the run's environment, not a flag (the allocator's):
    the variables the run must hold for the layout, which the exported scripts export and
    the worker applies (autotune.megatron.environment)."""
    read_environment: Callable[[Mapping[str, str]], Mapping[str, Any]] | None = None
    """Its fields as a script's exported variables give them (`--from-megatron`)."""
    core_config: CoreConfigTerm
    memory: MemoryTerm | None
    activations: ActivationTerm | None = None
    no_memory: str = ""
    """Why the lever has no memory term (required when `memory` and `activations` are
    None)."""
    cost: CostTerm | None
    stage_cost: StageTerm | None = None
    no_cost: str = ""
    """Why the lever has no cost term (required when `cost` and `stage_cost` are None)."""
    seed: Seed
    practice: Callable[[Layout, str], Mapping[str, Any]] | None = None
    """With Seed.PRACTICE: (layout, best impl) -> the fields' values Megatron practice takes."""
    fallback: tuple[tuple[str, Any], ...] = ()
    """With Seed.MEMORY: (field, value) savings that a seed without the cost model to rank them
    spends in this order when nothing fits without one (autotune.search.heuristics)."""
    derivable: tuple[Derivable, ...] = ()
    """Its counts a space may mark `derive` (autotune.search.derive)."""
    unread: tuple[Unread, ...] = ()
    """Its fields that Megatron does not read in some layouts (the run key leaves them out)."""
    constants: type | None = None
    """Its CostParams mixin, if it brings constants of its own. Calibration fits them where a
    measured layout turns one of the lever's fields from its default
    (autotune.predict.calibration.lever_fit_fields), unless `calibrated` says otherwise."""
    calibrated: tuple[str, ...] = ()
    """Its constants that every calibration fits whatever the layouts (`autotune calibrate`,
    tools/fit_constants.py), for a lever that every layout runs one way or another (the
    implementation: no layout turns it). A lever that names them is left out of
    lever_fit_fields, so a search's refit, which fits few constants, leaves them."""
    unpriced_time: bool = False
    """Its fields change the step time in ways the cost model leaves out (measured, not
    modelled: the NaN checks' waits), so no measured layout stands for a variant in them: the
    stop rule's echo and near-variant rules do not cross them (autotune.search.stop_rule), and
    the search measures a leader's variants in them next (autotune.search.execution.
    TrialExecutor.follow_unpriced). A lever without a cost term because it costs nothing
    measurable (the allocator's) leaves it False."""
    unmodeled: tuple[tuple[str, str], ...] = ()
    """Megatron-LM flags of the lever's area that change speed, memory or the numbers in ways
    its terms leave out, each with what it changes: a user's command that passes one is
    warned about (autotune.megatron.megatron_args.UNMODELED_FLAGS)."""

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.fields))

    def all_rules(self) -> tuple[Rule, ...]:
        return (*self.rules, *(r.rule() for r in self.requires))


def contract_problems(lever: Lever) -> list[str]:
    """What `lever` leaves undeclared, as sentences (empty: it keeps the contract). The rest of
    the contract needs megatron-core and the models, and is checked in
    tests/test_dimension_contract.py."""
    problems = []
    names = lever.field_names
    if not names:
        problems.append(f"lever {lever.name} declares no Layout field")
    if not lever.flag_rows and lever.environment is None:
        problems.append(f"lever {lever.name} declares no Megatron-LM flag row")
    if (lever.environment is None) != (lever.read_environment is None):
        problems.append(f"lever {lever.name}: an environment is written and read back, or "
                        "neither")
    read_back = set()
    if lever.read_environment is not None:
        read_back |= set(lever.read_environment({}))
    for row in lever.flag_rows:
        if row.read is None:
            problems.append(f"lever {lever.name}: flag row {row.name} does not read back")
        else:
            read_back |= set(row.read(Given({}, "no flags"))) | set(row.reads)
    missing = sorted(set(names) - read_back)
    if missing:
        problems.append(f"lever {lever.name}: no flag row reads back {', '.join(missing)}")
    memory = lever.memory is not None or lever.activations is not None
    cost = lever.cost is not None or lever.stage_cost is not None
    if not memory and not lever.no_memory:
        problems.append(f"lever {lever.name} has no memory term and does not say why")
    if not cost and not lever.no_cost:
        problems.append(f"lever {lever.name} has no cost term and does not say why")
    if memory and not cost and not lever.no_cost:
        problems.append(f"lever {lever.name} changes memory but not time and does not say "
                        "why: a saving is never free in the cost model")
    if lever.seed == Seed.PRACTICE and lever.practice is None:
        problems.append(f"lever {lever.name} is practice in the seeds but names no value")
    for name, _ in lever.fallback:
        if name not in names:
            problems.append(f"lever {lever.name}: its seed fallback sets {name}, not its field")
    known = {f.name for f in fields(lever.constants)} if lever.constants is not None else set()
    for name in lever.calibrated:
        if name not in known:
            problems.append(f"lever {lever.name}: calibrated {name} is not one of its constants")
    for derivable in lever.derivable:
        if derivable.name not in names:
            problems.append(f"lever {lever.name}: derivable {derivable.name} is not its field")
    for unread in lever.unread:
        if unread.name not in names:
            problems.append(f"lever {lever.name}: unread {unread.name} is not its field")
    for name in names:
        dim = next(f for f in fields(lever.fields) if f.name == name).metadata.get("dimension")
        if dim is None:
            problems.append(f"lever {lever.name}: field {name} is not declared with dimension()")
    return problems


def satisfy(s: Layout, requirements: tuple[Requires, ...]) -> Layout:
    """`s` with the fields every requirement that applies to it needs set."""
    changed = {name: value for r in requirements if r.when(s)
               for name, value in r.needs if getattr(s, name) != value}
    return replace(s, **changed) if changed else s


_State = TypeVar("_State", "MemoryState", "ActivationState", "CostState", "StageState")


def evolve(state: _State, **changes: Any) -> _State:
    """dataclasses.replace for the states the levers' terms pass along (MemoryState,
    ActivationState, CostState, StageState: frozen, without slots, every field an init field,
    no __post_init__): the same copy, its attributes copied at once rather than passed one by
    one through the generated __init__'s keyword arguments. The memory and cost models make one
    per lever term, a million for a plan of mixtral-8x7b on 64 GPUs, where
    dataclasses.replace was a tenth of the time (this copy costs a fifth of it)."""
    attrs = state.__dict__
    if not changes.keys() <= attrs.keys():
        unknown = ", ".join(sorted(changes.keys() - attrs.keys()))
        raise TypeError(f"{state.__class__.__name__} has no field {unknown}")
    copy = object.__new__(state.__class__)
    copy.__dict__.update(attrs)
    copy.__dict__.update(changes)
    return copy
