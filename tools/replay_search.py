"""Replay a real search on the CPU: `autotune MODEL --gpus N ...` exactly as the CLI runs it, with
every launch answered from a device run's measured figures instead of a GPU.

    python tools/replay_search.py SUMMARY.txt [--fp8-factor 1.12] [--noise 0.01] -- \
        llama3-8b --gpus 4 --gpu h200 --gbs 32

SUMMARY.txt is a study table that tools/study_table.py wrote on the device (its `| # | layout |
... | status | tokens/s |` rows): a layout measured there answers with its measured tokens/s;
any other layout with the committed cost model's prediction, times the model's bias that the
table shows (the median of measured / predicted over its FP8 rows for an FP8 layout, over its
bf16 rows otherwise; --fp8-factor and --bf16-factor set them instead). Every answer has the timed
steps' spread --noise (TrialMetrics.step_time_cv), as a worker reports it. --perturb P moves
each model answer by a fixed factor drawn for its layout from [1 - P, 1 + P] (its label's
hash seeds it, with --seed): a model wrong by up to P on every layout it did not measure, so
that a rule which trusts the model too far is seen to miss the true best. The last lines say the
true best of the replay (the fastest answer over every layout the memory model lets through)
and how far the search's best is below it. Transformer Engine
is taken as present, so FP8 is in the default space. Memory: the model's own prediction, so
nothing runs out of memory that the model lets through.

This is not a measurement: it counts what the search would launch and why it would stop, for
comparing versions of the search's rules on one recorded case. It prints each launch and the
stop reason, and a last line `launches N (finalists F), best LAYOUT at T tokens/s`.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from autotune.layouts.layout import Layout
from autotune.levers.fp8 import Fp8
from autotune.predict.cost import estimate_cost
from autotune.predict.gate import MemoryGate
from autotune.predict.memory import estimate_memory
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

ROW = re.compile(r"^\|\s*\d+\s*\|\s*(?P<layout>[^|]+?)\s*\|[^|]*\|\s*(?P<status>[A-Z_]+)\s*\|"
                 r"\s*(?P<tokens>[\d,]+)\s*\|")


def measured_table(summary: Path) -> dict[str, float]:
    """Layout label (Layout.describe) -> measured tokens/s, from the study table's OK rows."""
    table: dict[str, float] = {}
    for line in summary.read_text().splitlines():
        m = ROW.match(line)
        if m and m["status"] == "OK":
            table.setdefault(m["layout"], float(m["tokens"].replace(",", "")))
    return table


@dataclass
class ReplayBackend:
    """Answers each launch from the measured table, else from the model (see the module)."""

    cluster: ClusterSpec
    table: dict[str, float]
    fp8_factor: float | None
    bf16_factor: float | None
    noise: float
    perturb: float = 0.0
    seed: int = 0
    model: ModelSpec | None = None
    valid: list[Layout] = field(default_factory=list)
    """The search's own valid layouts (its LayoutMap), for the factors and the true best."""
    name: str = "worker"
    predicted: bool = False
    launches: list[tuple[Layout, float, bool]] = field(default_factory=list)

    def biases(self, model: ModelSpec) -> None:
        """The factors the table shows (see the module), over the search's layouts."""
        ratios: dict[bool, list[float]] = {True: [], False: []}
        for s in self.valid:
            if s.describe() in self.table:
                predicted = estimate_cost(model, s, self.cluster).tokens_per_s
                ratios[s.fp8 != Fp8.OFF].append(self.table[s.describe()] / predicted)
        self.fp8_factor = self.fp8_factor or statistics.median(ratios[True] or [1.0])
        self.bf16_factor = self.bf16_factor or statistics.median(ratios[False] or [1.0])
        print(f"replay: model x {self.fp8_factor:.3f} for FP8 ({len(ratios[True])} rows), x "
              f"{self.bf16_factor:.3f} for bf16 ({len(ratios[False])} rows)", file=sys.stderr)

    def answer(self, model: ModelSpec, s: Layout) -> float:
        """The layout's tokens/s in this replay: measured, else the model's, bent."""
        found = self.table.get(s.describe())
        if found is not None:
            return found
        factor = (self.fp8_factor if s.fp8 != Fp8.OFF else self.bf16_factor) or 1.0
        digest = hashlib.sha256(f"{self.seed} {s.describe()}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64 * 2 - 1
        return estimate_cost(model, s, self.cluster).tokens_per_s * factor * (
            1 + self.perturb * u)

    def true_best(self, model: ModelSpec) -> tuple[Layout, float]:
        """The fastest answer over the search's layouts the memory gate lets through."""
        gate = MemoryGate(model, self.cluster)
        fits = [s for s in self.valid if gate.decide(s).launch]
        return max(((s, self.answer(model, s)) for s in fits), key=lambda x: x[1])

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        s = spec.layout
        if not self.launches:
            self.model = spec.model
            self.biases(spec.model)
        found = self.answer(spec.model, s)
        self.launches.append((s, found, s.describe() in self.table))
        step = s.gbs * spec.model.seq_length / found
        peak = int(estimate_memory(spec.model, s, self.cluster).peak_bytes)
        return TrialMetrics(status=TrialStatus.OK, step_time_s=step, step_time_p90_s=step,
                            step_time_cv=self.noise, tokens_per_s=found, tflops_per_gpu=1.0,
                            mfu=0.5, peak_allocated_bytes=peak, peak_reserved_bytes=peak,
                            loss_finite=True)

    def close(self) -> None:
        pass


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: replay_search.py SUMMARY.txt [options] -- AUTOTUNE_ARGS...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("summary", type=Path)
    parser.add_argument("--fp8-factor", type=float, default=None)
    parser.add_argument("--bf16-factor", type=float, default=None)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--perturb", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", default=None,
                        help="keep the study here (default: a temporary folder)")
    args = parser.parse_args(argv[:cut])
    table = measured_table(args.summary)
    made: list[ReplayBackend] = []

    def backend(name: object, cluster: ClusterSpec, *rest: object, **kw: object) -> ReplayBackend:
        made.append(ReplayBackend(cluster, table, args.fp8_factor, args.bf16_factor,
                                  args.noise, args.perturb, args.seed))
        return made[0]


    from autotune.cli import main as autotune_main
    from autotune.search.layout_map import LayoutMap

    plain_of = LayoutMap.of

    def layout_map(cfg: object) -> LayoutMap:
        found = plain_of(cfg)  # type: ignore[arg-type]
        made[0].valid = list(found.valid)
        return found

    gpus = int(argv[argv.index("--gpus") + 1]) if "--gpus" in argv else 1
    with tempfile.TemporaryDirectory() as scratch, \
            mock.patch("autotune.commands.search.make_backend", backend), \
            mock.patch("autotune.commands.search.local_gpu_count", lambda: gpus), \
            mock.patch("autotune.commands.search.te_available", lambda: True), \
            mock.patch("autotune.search.scheduling.te_available", lambda: True), \
            mock.patch.object(LayoutMap, "of", layout_map):
        code = autotune_main([*argv[cut + 1:], "--results-dir", args.results_dir or scratch,
                              "--json"])
    if not made:
        return code
    launches = made[0].launches
    for i, (s, tokens, was_measured) in enumerate(launches):
        print(f"{i:3d} {s.describe():70s} {tokens:10,.0f} {'measured' if was_measured else ''}")
    best = max(launches, key=lambda x: x[1], default=None)
    said = f", best {best[0].describe()} at {best[1]:,.0f} tokens/s" if best else ""
    print(f"launches {len(launches)}{said}")
    if best is not None and made[0].model is not None:
        top, tokens = made[0].true_best(made[0].model)
        print(f"true best {top.describe()} at {tokens:,.0f} tokens/s; the search's best is "
              f"{best[1] / tokens - 1:+.1%} from it")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
