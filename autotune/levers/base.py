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
  back);
- `core_config`: its keys for megatron-core's TransformerConfig, DistributedDataParallelConfig and
  OptimizerConfig (autotune.megatron.core_config);
- `memory`: how it changes a rank's model states (`MemoryState`, autotune.predict.memory) and
  `cost`: how it changes a step's terms (`CostState`, autotune.predict.cost). Each is a pure
  function of the layout applied in registry order, so a lever that reshapes the optimizer state
  (the distributed optimizer, lower precision) comes before one that moves it (CPU offload);
- `seed`: its part in Alpa's seeds (autotune.search.heuristics): the value Megatron practice starts
  from, or a memory saving the seeds may spend on a larger micro-batch;
- `constants`: a dataclass mixin of its cost constants, joined into
  autotune.predict.cost.CostParams (through `autotune.levers.LeverConstants`) so that calibration
  can fit them.

tests/test_dimension_contract.py checks every registered lever against this contract
(`contract_problems`) and against megatron-core's own configuration classes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from autotune.levers.flags import FlagRow, Given

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["CONFIG_PARTS", "CoreConfigTerm", "CostState", "Lever", "MemoryState", "Requires",
           "Rule", "Seed", "contract_problems", "satisfy"]


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


CONFIG_PARTS = ("transformer", "ddp", "optimizer")
"""The core-config parts a lever may add keys to: megatron-core's TransformerConfig,
DistributedDataParallelConfig and OptimizerConfig keyword arguments
(autotune.megatron.core_config)."""

CoreConfigTerm = Callable[["ModelSpec", "Layout"], dict[str, dict[str, Any]]]
"""(model, layout) -> {part: {keyword: value}} for parts among CONFIG_PARTS. dtypes by name
("bfloat16"), as the rest of the core config: autotune.worker.build resolves every
`*_dtype` key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryState:
    """What one rank of one pipeline stage keeps per parameter and per logit, before the levers
    change it (megatron-core's defaults with every lever off) and after, in registry order.
    autotune.predict.memory turns it into the StageMemory terms."""

    optimizer_bytes_per_param: float
    """GPU bytes of optimizer state per parameter of the local shard: fp32 master weights and
    Adam's two moments, 12 B (ZeRO Section 3.1, K = 12)."""
    host_bytes_per_param: float = 0.0
    """Host (CPU) bytes per parameter of the local shard (an offloaded optimizer)."""
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


@dataclass(frozen=True, slots=True, kw_only=True)
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


MemoryTerm = Callable[["ModelSpec", "Layout", MemoryState], MemoryState]
CostTerm = Callable[["ModelSpec", "Layout", "ClusterSpec", "CostParams", CostState], CostState]


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
    core_config: CoreConfigTerm
    memory: MemoryTerm | None
    no_memory: str = ""
    """Why the lever has no memory term (required when `memory` is None)."""
    cost: CostTerm | None
    no_cost: str = ""
    """Why the lever has no cost term (required when `cost` is None)."""
    seed: Seed
    practice: Callable[[Layout, str], Mapping[str, Any]] | None = None
    """With Seed.PRACTICE: (layout, best impl) -> the fields' values Megatron practice takes."""
    constants: type | None = None
    """Its CostParams mixin, if it brings constants of its own."""
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
    if not lever.flag_rows:
        problems.append(f"lever {lever.name} declares no Megatron-LM flag row")
    read_back = set()
    for row in lever.flag_rows:
        if row.read is None:
            problems.append(f"lever {lever.name}: flag row {row.name} does not read back")
        else:
            read_back |= set(row.read(Given({}, "no flags")))
    missing = sorted(set(names) - read_back)
    if missing:
        problems.append(f"lever {lever.name}: no flag row reads back {', '.join(missing)}")
    if lever.memory is None and not lever.no_memory:
        problems.append(f"lever {lever.name} has no memory term and does not say why")
    if lever.cost is None and not lever.no_cost:
        problems.append(f"lever {lever.name} has no cost term and does not say why")
    if lever.memory is not None and lever.cost is None:
        problems.append(f"lever {lever.name} changes memory but not time: a saving is never "
                        "free in the cost model")
    if lever.seed == Seed.PRACTICE and lever.practice is None:
        problems.append(f"lever {lever.name} is practice in the seeds but names no value")
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
