"""Which transformer implementations a search may rank: one decision for every backend.

Megatron-LM runs `local` or Transformer Engine (`te`, its default); autotune's `sdpa` (the local
spec with PyTorch SDPA attention) exists only in autotune's worker, and the export writes te for
it (`megatron_args.exported_layout`). A ranking is only worth what the exported command runs
(issue 25 item 4), so:
- a plan (`--backend simulate`) ranks the implementation the export writes: sdpa becomes te
  unless the user asked for sdpa themselves (their own space file or a pin), and then the
  outputs say its figure is sdpa's (`megatron_args.measured_as_exported`);
- real trials with Transformer Engine installed measure te in sdpa's place, so the winner's
  figure is the command's; without it te cannot run, and sdpa stands in (said by the outputs);
- `--backend megatron-lm` runs pretrain_gpt.py, which has no sdpa;
- a model whose head dim no fused attention kernel runs ranks local only, whatever the backend
  (autotune.levers.transformer_impl.fused_attention_unavailable says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.dimensions import Impl
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.levers.transformer_impl import FUSED_IMPLS, fused_attention_unavailable
from autotune.megatron.megatron_args import exported_layout
from autotune.search.backends import BackendName

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec

__all__ = ["ImplChoice", "practice_impl", "rankable_impls"]

_NO_TE = "Transformer Engine is not installed"
_PLANNED_AS_TE = ("the export writes te for it, so a plan ranks te; list impl sdpa in your own "
                  "space or pin it to rank it")


@dataclass(frozen=True, slots=True)
class ImplChoice:
    """The implementations a search ranks, and why each listed one was left out."""

    kept: tuple[Impl, ...]
    left_out: dict[Impl, str] = field(default_factory=dict)

    @property
    def quiet(self) -> bool:
        """Nothing to say: the only change is a plan over a shipped space ranking te for sdpa
        (every plan would print the same line, and its table shows what is exported)."""
        return set(self.left_out.values()) == {_PLANNED_AS_TE}

    def note(self) -> str | None:
        """One line for stderr when the space's list was changed; None when it was not."""
        if not self.left_out or self.quiet:
            return None
        # Impls left out for one reason share it (te and sdpa for a head dim: one line).
        by_reason: dict[str, list[str]] = {}
        for i, why in sorted(self.left_out.items()):
            by_reason.setdefault(why, []).append(str(i))
        return "autotune: impl left out: " + "; ".join(
            f"{', '.join(names)} ({why})" for why, names in by_reason.items())


def _sdpa_reason(backend: str, *, te_installed: bool, asked: bool) -> str | None:
    """Why sdpa is not ranked on `backend`; None when it is."""
    if backend == BackendName.MEGATRON_LM:
        return "Megatron-LM has no such impl"
    if backend == BackendName.SIMULATE:
        return None if asked else _PLANNED_AS_TE
    return "measured as te, which its export writes for it: issue 25" if te_installed else None


def rankable_impls(impls: tuple[Impl, ...], backend: str, *, te_installed: bool,
                   asked: bool, model: ModelSpec | None = None,
                   compute_capability: tuple[int, int] | None = None) -> ImplChoice:
    """Of a space's `impls`, those `backend` may rank. `te_installed`: Transformer Engine
    imports here (real trials need it; a plan does not). `asked`: the user chose the impl
    candidates themselves (autotune.search.space.SearchSpace.chosen). `model`: where its head
    dim has no fused attention kernel, te and sdpa are left out (the rule fused_head_dim
    would refuse each of their layouts; here the user is told once, and why), on a GPU of
    `compute_capability` (None: a Hopper's; Multi-Latent Attention's head dims depend on it)."""
    impls = tuple(Impl(i) for i in impls)
    te_runs = backend == BackendName.SIMULATE or te_installed
    left_out: dict[Impl, str] = {}
    if not te_runs and Impl.TE in impls:
        left_out[Impl.TE] = _NO_TE
    why = _sdpa_reason(backend, te_installed=te_installed, asked=asked)
    unfused = None if model is None else fused_attention_unavailable(model, compute_capability)
    added: tuple[Impl, ...] = ()
    if Impl.SDPA in impls and why is not None:
        left_out[Impl.SDPA] = why
        standin = exported_layout(Layout(impl=Impl.SDPA)).impl
        if te_runs and standin not in impls and unfused is None:
            added = (standin,)
    if unfused is not None:
        left_out.update((i, unfused) for i in FUSED_IMPLS if i in impls)
    kept = tuple(i for i in impls if i not in left_out) + added
    if not kept:
        raise ConfigError(f"impl candidates {', '.join(impls)} cannot run here "
                          f"({'; '.join(sorted(set(left_out.values())))})")
    return ImplChoice(kept, left_out)


def practice_impl(backend: str, *, te_installed: bool) -> Impl:
    """The implementation Megatron practice (Alpa's seeds) starts from: te, which Megatron-LM
    runs by default, where it runs or is planned; else sdpa, its stand-in."""
    return Impl.TE if backend == BackendName.SIMULATE or te_installed else Impl.SDPA
