"""Count what a fixed number of the TPE sampler's asks propose, on the CPU: how many break a
Megatron rule (INVALID), repeat a layout already asked (duplicates) or are new valid layouts,
and the best figure found.

    python tools/count_invalid_asks.py MODEL --gpus N [--gbs 16] [--seq-len 4096] \
        [--asks 60] [--seeds 0 1 2 3 4] [--full | --plain] [--after-repeat] [--perturb P]

The space is search_spaces/default.yaml on H200s. Each valid proposal is told the cost model's
predicted tokens/s and peak (a duplicate its first figures, an INVALID proposal PRUNED), as a
plan would tell them. `--full` asks every parameter in every trial, with the sampler of the
version before the conditional asks (autotune.search.layout_map, LayoutMap.ask): the before
figure of the same space and seeds. `--plain`: conditional asks with TPE alone, without
autotune.search.layout_map.ValidSampler (the sampler of session 20). `--after-repeat`: after a
duplicate, the next ask is the model's fastest untried layout that the memory gate lets through
(enqueued, as the search's Scheduler.after_repeat does). `--perturb P`: each layout's told
figure is the model's times a fixed factor in [1 - P, 1 + P] drawn from its label's hash (a
model wrong by up to P, as tools/replay_search.py --perturb), while the enqueued layout is
still ranked by the unperturbed model: the best found is then not the model's own answer.
Best: the fastest told figure among the layouts tried that the memory gate lets through.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from dataclasses import replace

import optuna
from optuna.trial import TrialState

from autotune.layouts.layout import Layout
from autotune.predict.cost import estimate_cost
from autotune.predict.gate import MemoryGate
from autotune.search.backends import SimulateBackend
from autotune.search.config import Sampler, SearchConfig
from autotune.search.layout_map import LayoutMap, search_sampler
from autotune.search.space import load_space
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

optuna.logging.set_verbosity(optuna.logging.ERROR)


def told(cfg: SearchConfig, s: Layout, perturb: float, seed: int) -> float:
    """The figure a layout is told: the model's, moved by its fixed factor (--perturb)."""
    digest = hashlib.sha256(f"{seed} {s.describe()}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64 * 2 - 1
    return estimate_cost(cfg.model, s, cfg.cluster).tokens_per_s * (1 + perturb * u)


def count(layouts: LayoutMap, cfg: SearchConfig, asks: int, seed: int,
          full: bool, plain: bool = False, after_repeat: bool = False,
          perturb: float = 0.0) -> tuple[int, int, int, float]:
    sampler = (optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8,
                                          constant_liar=True) if full
               else search_sampler(Sampler.TPE, seed, None if plain else layouts))
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    gate = MemoryGate(cfg.model, cfg.cluster)
    # The search's ranking (Knowledge.ranked): the layouts predicted to fit, fastest first.
    ranked = sorted((s for s in layouts.valid if gate.decide(s).launch),
                    key=lambda s: estimate_cost(cfg.model, s, cfg.cluster).tokens_per_s,
                    reverse=True) if after_repeat else []
    fits: set[Layout] = set(ranked)
    seen: dict[object, list[float]] = {}
    invalid = duplicates = 0
    best = 0.0
    for _ in range(asks):
        if full:
            trial = study.ask(layouts.distributions)
        else:
            trial = study.ask()
            layouts.ask(trial)
        s = layouts.layout(trial.params)
        if s is None:
            invalid += 1
            study.tell(trial, state=TrialState.PRUNED)
            continue
        if s in seen:
            duplicates += 1
            untried = next((r for r in ranked if r not in seen), None)
            if untried is not None:
                study.enqueue_trial(layouts.params(untried))
        else:
            seen[s] = [told(cfg, s, perturb, seed), 1.0]
            if s in fits or gate.decide(s).launch:
                best = max(best, seen[s][0])
        study.tell(trial, seen[s])
    return invalid, duplicates, len(seen), best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gbs", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--asks", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--plain", action="store_true",
                        help="conditional asks with the plain TPE sampler (before ValidSampler)")
    parser.add_argument("--after-repeat", action="store_true",
                        help="after a duplicate, enqueue the model's fastest untried layout")
    parser.add_argument("--perturb", type=float, default=0.0,
                        help="tell each layout the model's figure moved by up to this part")
    args = parser.parse_args(argv)
    model = replace(load_model(args.model), global_batch_size=args.gbs)
    if args.seq_len:
        model = replace(model, seq_length=args.seq_len)
    cluster = ClusterSpec(num_gpus=args.gpus, gpus_per_node=min(args.gpus, 8),
                          gpu=gpu_spec("h200"))
    cfg = SearchConfig(model=model, cluster=cluster, space=load_space(),
                       backend=SimulateBackend(cluster))
    layouts = LayoutMap.of(cfg)
    rows = [count(layouts, cfg, args.asks, seed, args.full, args.plain, args.after_repeat,
                  args.perturb) for seed in args.seeds]
    kind = "full" if args.full else "plain" if args.plain else "conditional"
    if args.after_repeat:
        kind += ", the model's best untried after a repeat"
    gate = MemoryGate(cfg.model, cfg.cluster)
    fitting = [s for s in layouts.valid if gate.decide(s).launch]
    tops = [max(told(cfg, s, args.perturb, seed) for s in fitting) for seed in args.seeds]
    for seed, (invalid, dup, new, best), top in zip(args.seeds, rows, tops, strict=True):
        print(f"seed {seed}: {args.asks} asks, {invalid} INVALID, {dup} duplicates, "
              f"{new} new valid layouts, best {best:,.0f} tokens/s ({best / top - 1:+.1%} "
              f"from the fastest fitting layout, {top:,.0f})")
    print(f"mean over {len(rows)} seeds: INVALID {statistics.mean(r[0] for r in rows):.1f}, "
          f"duplicates {statistics.mean(r[1] for r in rows):.1f}, new valid "
          f"{statistics.mean(r[2] for r in rows):.1f} of {args.asks} asks, best "
          f"{statistics.mean(r[3] / top - 1 for r, top in zip(rows, tops, strict=True)):+.1%} "
          f"from the fastest fitting layout ({len(layouts.valid)} valid layouts, {kind} asks)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
