"""Session 17's input sweep: bad inputs on the newest surfaces, through the console script.

    python sweep.py TREE OUT.json   # TREE: a checkout of autotune (PYTHONPATH=TREE)

Each case runs `autotune ARGS` with --backend simulate where it searches (no GPU), in a scratch
folder of its own (/tmp/s17sweep/<tree>/), and records the exit code, the first line of
stderr and whether stderr holds a traceback. A study for the export cases is made first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

AUTOTUNE = "/work/main/.venv/bin/autotune"
TREE = Path(sys.argv[1]).resolve()
OUT = Path(sys.argv[2])
D = Path("/tmp/s17sweep") / TREE.name
SEED = (Path(__file__).resolve().parents[3] / "tests/data/megatron/seed-tutorial.sh").read_text()
SIM = ["--backend", "simulate"]
SEARCH = ["gpt2", "--gpus", "1", *SIM, "--trials", "2"]


def script(*extra: str, drop: str = "") -> str:
    """The seed tutorial's command with `extra` lines added before --lr (`drop`: a flag
    line removed)."""
    lines = [ln for ln in SEED.splitlines() if not (drop and ln.strip().startswith(drop))]
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("--lr "))
    return "\n".join([*lines[:at], *(f"    {e} \\" for e in extra), *lines[at:]]) + "\n"


FILES: dict[str, str] = {
    "empty.yaml": "", "empty.json": "", "empty.sh": "",
    "sp_fp8_bogus.yaml": "fp8: [bogus]\n", "sp_fp8_on.yaml": "fp8: [on]\n",
    "sp_fp8_emptylist.yaml": "fp8: []\n", "sp_fp8_scalar.yaml": "fp8: hybrid\n",
    "sp_fp8_upper.yaml": "fp8: [HYBRID]\n", "sp_fp8_null.yaml": "fp8: [null]\n",
    "sp_fp8_num.yaml": "fp8: [1e3]\n", "sp_recipe_bogus.yaml": "fp8_recipe: [bogus]\n",
    "sp_recipe_mxfp8.yaml": "impl: [te]\nfp8: [hybrid]\nfp8_recipe: [mxfp8]\n",
    "sp_recipe_only.yaml": "fp8_recipe: [tensorwise]\n",
    "sp_fp8_local.yaml": "impl: [local]\nfp8: [hybrid]\n",
    "sp_fp8pg_yes.yaml": "fp8_param_gather: [yes]\n",
    "sp_fp8_dict.yaml": "fp8: {hybrid: 1}\n",
    "sp_mbs_1e3.yaml": "mbs: [1e0, 2e0]\n", "sp_mbs_15e.yaml": "mbs: [1.5e0]\n",
    "cl_1e3.yaml": ("gpu: h100-80gb\ngpus_per_node: 8e0\nnvlink_gb_per_s: 4.5e2\n"
                    "inter_node_gbit_per_s: 4e2\n"),
    "model_1e3.yaml": ("name: tiny\nnum_layers: 1.2e1\nhidden_size: 768\nnum_attention_heads: 12\n"
                       "vocab_size: 50257\nseq_length: 1.024e3\nmax_position_embeddings: 1024\n"
                       "global_batch_size: 6.4e1\n"),
    "model_unicode.yaml": ("name: \"模型\\u202e-\\x1b[31mred\"\nnum_layers: 12\nhidden_size: 768\n"
                           "num_attention_heads: 12\nvocab_size: 50257\nseq_length: 1024\n"
                           "max_position_embeddings: 1024\nglobal_batch_size: 64\n"),
    "model_newline.yaml": ("name: \"x\\ntouch PWNED\"\nnum_layers: 12\nhidden_size: 768\n"
                           "num_attention_heads: 12\nvocab_size: 50257\nseq_length: 1024\n"
                           "max_position_embeddings: 1024\nglobal_batch_size: 64\n"),
    "layout_1e3.json": '{"tp": 1e0, "pp": 1, "mbs": 4e0, "gbs": 6.4e1}',
    "fm_hybrid.sh": script("--fp8-format hybrid"),
    "fm_bogus.sh": script("--fp8-format bogus"),
    "fm_e5m2.sh": script("--fp8-format e5m2"),
    "fm_upper.sh": script("--fp8-format HYBRID"),
    "fm_missing_value.sh": script("--fp8-format"),
    "fm_missing_last.sh": SEED.rstrip().rstrip("\\").rstrip() + " \\\n    --fp8-format\n",
    "fm_equals.sh": script("--fp8-format=hybrid"),
    "fm_empty_value.sh": script("--fp8-format ''"),
    "fm_unset_var.sh": script("--fp8-format $FMT"),
    "fm_twice.sh": script("--fp8-format hybrid", "--fp8-format e4m3"),
    "fm_recipe_only.sh": script("--fp8-recipe tensorwise"),
    "fm_recipe_bogus.sh": script("--fp8-format hybrid", "--fp8-recipe bogus"),
    "fm_recipe_missing.sh": script("--fp8-format hybrid", "--fp8-recipe"),
    "fm_recipe_mxfp8.sh": script("--fp8-format hybrid", "--fp8-recipe mxfp8"),
    "fm_recipe_blockwise.sh": script("--fp8-format e4m3", "--fp8-recipe blockwise"),
    "fm_pg_only.sh": script("--fp8-param-gather"),
    "fm_fp16.sh": script("--fp16", drop="--bf16"),
    "fm_no_precision.sh": script(drop="--bf16"),
    "fm_margin.sh": script("--fp8-format hybrid", "--fp8-margin -1"),
    "fm_amax.sh": script("--fp8-format hybrid", "--fp8-amax-history-len 0"),
    "fm_amax_nan.sh": script("--fp8-format hybrid", "--fp8-amax-history-len nan"),
    "fm_format_number.sh": script("--fp8-format 8"),
    "fm_format_unicode.sh": script("--fp8-format hybrіd"),  # a Cyrillic i
    "fm_binary.sh": "\x00\x01\x02",
    "mine.sh": script("--recompute-granularity full", "--recompute-method uniform",
                      "--recompute-num-layers 1").replace("--micro-batch-size 15",
                                                          "--micro-batch-size 1"),
}


def setup() -> None:
    shutil.rmtree(D, ignore_errors=True)
    (D / "dir.yaml").mkdir(parents=True)
    (D / "dir").mkdir()
    (D / "results").mkdir()
    for name, text in FILES.items():
        (D / name).write_text(text)
    run(["gpt2", "--gpus", "8", *SIM, "--trials", "3", "--results-dir", str(D / "study"),
         "--study", "s", "--json"], "setup")
    run(["--from-megatron", "{D}/mine.sh", *SIM, "--trials", "20", "--results-dir",
         str(D / "fmstudy"), "--json"], "setup from-megatron")
    (D / "link.sh").symlink_to(D / "mine.sh")


CASES: list[tuple[str, list[str]]] = [
    # --precision
    ("precision fp8", [*SEARCH, "--precision", "fp8"]),
    ("precision BF16", [*SEARCH, "--precision", "BF16"]),
    ("precision empty", [*SEARCH, "--precision", ""]),
    ("precision fp16", [*SEARCH, "--precision", "fp16"]),
    ("precision bf16 + fix fp8=hybrid", [*SEARCH, "--precision", "bf16", "--fix", "fp8=hybrid"]),
    ("precision any + fix fp8=off", [*SEARCH, "--precision", "any", "--fix", "fp8=off"]),
    ("precision given twice", [*SEARCH, "--precision", "bf16", "--precision", "any"]),
    ("precision any --dry-run --json", ["gpt2", "--gpus", "1", "--precision", "any",
                                        "--dry-run", "--json", *SIM]),
    ("estimate --precision bf16", ["estimate", "gpt2", "--gpus", "1", "--precision", "bf16"]),
    ("fix fp8=bogus", [*SEARCH, "--fix", "fp8=bogus"]),
    ("fix fp8_recipe=mxfp8", [*SEARCH, "--fix", "fp8=hybrid", "--fix", "fp8_recipe=mxfp8"]),
    ("--fp8-format bogus (option)", [*SEARCH, "--fp8-format", "bogus"]),
    ("--fp8-recipe '' (option)", [*SEARCH, "--fp8-recipe", ""]),
    # fp8 / fp8_recipe in space files
    *[(f"space {n}", [*SEARCH, "--space", f"{{D}}/{n}.yaml"]) for n in (
        "sp_fp8_bogus", "sp_fp8_on", "sp_fp8_emptylist", "sp_fp8_scalar", "sp_fp8_upper",
        "sp_fp8_null", "sp_fp8_num", "sp_recipe_bogus", "sp_recipe_mxfp8", "sp_recipe_only",
        "sp_fp8_local", "sp_fp8pg_yes", "sp_fp8_dict", "sp_mbs_1e3", "sp_mbs_15e")],
    ("space 1e0 --dry-run", ["gpt2", "--gpus", "1", "--space", "{D}/sp_mbs_1e3.yaml",
                             "--dry-run", *SIM]),
    # --from-megatron with FP8 flags
    *[(f"from-megatron {n}", ["--from-megatron", f"{{D}}/{n}.sh", *SIM, "--trials", "2",
                              "--gpu", "h100-80gb"])
      for n in ("fm_hybrid", "fm_bogus", "fm_e5m2", "fm_upper", "fm_missing_value",
                "fm_missing_last", "fm_equals", "fm_empty_value", "fm_unset_var", "fm_twice",
                "fm_recipe_only", "fm_recipe_bogus", "fm_recipe_missing", "fm_recipe_mxfp8",
                "fm_recipe_blockwise", "fm_pg_only", "fm_fp16", "fm_no_precision",
                "fm_margin", "fm_amax", "fm_amax_nan", "fm_format_number",
                "fm_format_unicode", "fm_binary")],
    ("from-megatron hybrid --precision bf16", ["--from-megatron", "{D}/fm_hybrid.sh", *SIM,
                                               "--trials", "2", "--precision", "bf16"]),
    ("from-megatron --precision any", ["--from-megatron", "{D}/fm_hybrid.sh", *SIM,
                                       "--trials", "2", "--precision", "any"]),
    ("estimate --from-megatron bogus", ["estimate", "--from-megatron", "{D}/fm_bogus.sh"]),
    # export options
    ("export --format ''", ["export", "--results-dir", "{D}/study", "--format", ""]),
    ("export --format JSON", ["export", "--results-dir", "{D}/study", "--format", "JSON"]),
    ("export --nodes -1", ["export", "--results-dir", "{D}/study", "--nodes", "-1"]),
    ("export --nodes 0", ["export", "--results-dir", "{D}/study", "--nodes", "0"]),
    ("export --train-iters -5", ["export", "--results-dir", "{D}/study", "--train-iters", "-5"]),
    ("export --train-iters 1e3", ["export", "--results-dir", "{D}/study", "--train-iters",
                                  "1e3"]),
    ("export --trial abc", ["export", "--results-dir", "{D}/study", "--trial", "abc"]),
    ("export --megatron-version ''", ["export", "--results-dir", "{D}/study",
                                      "--megatron-version", ""]),
    ("export --megatron-version 0.19", ["export", "--results-dir", "{D}/study",
                                        "--megatron-version", "0.19"]),
    ("export --megatron-version 99.0", ["export", "--results-dir", "{D}/study",
                                        "--megatron-version", "99.0"]),
    ("export --megatron-lm ''", ["export", "--results-dir", "{D}/study", "--megatron-lm", ""]),
    ("export --megatron-lm $(touch)", ["export", "--results-dir", "{D}/study", "--megatron-lm",
                                       "/x/$(touch {D}/PWNED)", "-o", "{D}/out.sh"]),
    ("export --format json --megatron-lm x", ["export", "--results-dir", "{D}/study",
                                              "--format", "json", "--megatron-lm", "/x"]),
    ("export --format torchrun --train-iters 5", ["export", "--results-dir", "{D}/study",
                                                  "--format", "torchrun", "--train-iters", "5"]),
    ("export -o study.db", ["export", "--results-dir", "{D}/study", "-o",
                            "{D}/study/s/study.db"]),
    ("export -o dir", ["export", "--results-dir", "{D}/study", "-o", "{D}/dir"]),
    ("export -o its --from-megatron", ["export", "--results-dir", "{D}/study",
                                       "--from-megatron", "{D}/fm_hybrid.sh", "-o",
                                       "{D}/fm_hybrid.sh"]),
    ("export --from-megatron other model", ["export", "--results-dir", "{D}/study",
                                            "--from-megatron", "{D}/fm_hybrid.sh"]),
    ("export --from-megatron empty", ["export", "--results-dir", "{D}/study",
                                      "--from-megatron", "{D}/empty.sh"]),
    ("export --line 0", ["export", "--results-dir", "{D}/study", "--line", "0"]),
    ("export --study ''", ["export", "--results-dir", "{D}/study", "--study", ""]),
    ("export --format slurm --nodes 3", ["export", "--results-dir", "{D}/study", "--format",
                                         "slurm", "--nodes", "3"]),
    ("export --json", ["export", "--results-dir", "{D}/study", "--json"]),
    # --isolation, --stop-rule, --json combinations
    ("isolation bogus", [*SEARCH, "--isolation", "bogus"]),
    ("isolation WARM", [*SEARCH, "--isolation", "WARM"]),
    ("isolation ''", [*SEARCH, "--isolation", ""]),
    ("isolation cold + simulate", [*SEARCH, "--isolation", "cold"]),
    ("stop-rule bogus", [*SEARCH, "--stop-rule", "bogus"]),
    ("stop-rule NONE", [*SEARCH, "--stop-rule", "NONE"]),
    ("stop-rule ''", [*SEARCH, "--stop-rule", ""]),
    ("stop-rule none --sampler grid", [*SEARCH, "--stop-rule", "none", "--sampler", "grid"]),
    ("--json --dry-run bad space", ["gpt2", "--gpus", "1", "--json", "--dry-run", "--space",
                                    "{D}/sp_fp8_bogus.yaml", *SIM]),
    ("--json nothing fits", ["gpt-1t", "--gpus", "1", "--json", *SIM]),
    ("--json --json", [*SEARCH, "--json", "--json"]),
    ("--json=yes", [*SEARCH, "--json=yes"]),
    ("estimate --json bad gpus", ["estimate", "gpt2", "--gpus", "3", "--json"]),
    ("models --json", ["models", "--json"]),
    ("report --json", ["report", "--results-dir", "{D}/study", "--json"]),
    # unicode / odd model names
    ("model 模型", ["模型", "--gpus", "1", *SIM]),
    ("model rtl override", ["gpt2\u202e", "--gpus", "1", *SIM]),
    ("model ANSI escape", ["\x1b[31mgpt2", "--gpus", "1", *SIM]),
    ("model '-'", ["estimate", "-", "--gpus", "1"]),
    ("model ''", ["", "--gpus", "1", *SIM]),
    ("model '   '", ["   ", "--gpus", "1", *SIM]),
    ("model newline", ["gpt2\n", "--gpus", "1", *SIM]),
    ("model ../etc/passwd", ["estimate", "../../../../etc/passwd", "--gpus", "1"]),
    ("model yaml unicode name", ["{D}/model_unicode.yaml", "--gpus", "1", *SIM, "--trials",
                                 "1", "--results-dir", "{D}/results"]),
    ("model yaml newline name", ["{D}/model_newline.yaml", "--gpus", "1", *SIM]),
    ("export -o the --from-megatron file", ["export", "--results-dir", "{D}/fmstudy",
                                            "--from-megatron", "{D}/mine.sh", "-o",
                                            "{D}/mine.sh"]),
    ("export -o a link to it", ["export", "--results-dir", "{D}/fmstudy", "--from-megatron",
                                "{D}/mine.sh", "-o", "{D}/link.sh"]),
    ("export --format json --nodes 1", ["export", "--results-dir", "{D}/study", "--format",
                                        "json", "--nodes", "1"]),
    ("estimate ''", ["estimate", "", "--gpus", "1"]),
    ("calibrate -o missing folder", ["calibrate", "--results-dir", "{D}/study", "-o",
                                     "{D}/nope/c.json"]),
    ("from-megatron + --megatron-lm /nonexistent", ["--from-megatron", "{D}/fm_hybrid.sh",
                                                    *SIM, "--megatron-lm", "/nonexistent"]),
    ("--megatron-lm '' simulate", [*SEARCH, "--megatron-lm", ""]),
    ("--trial-timeout nan", [*SEARCH, "--trial-timeout", "nan"]),
    ("model yaml 1e3 counts", ["estimate", "{D}/model_1e3.yaml", "--gpus", "1"]),
    # empty files, directories as files
    ("model empty.yaml", ["estimate", "{D}/empty.yaml", "--gpus", "1"]),
    ("space empty.yaml", [*SEARCH, "--space", "{D}/empty.yaml"]),
    ("cluster empty.yaml", [*SEARCH, "--cluster", "{D}/empty.yaml"]),
    ("calibration empty.json", [*SEARCH, "--calibration", "{D}/empty.json"]),
    ("layout empty.json", ["estimate", "gpt2", "--gpus", "1", "--layout", "{D}/empty.json"]),
    ("from-megatron empty.sh", ["--from-megatron", "{D}/empty.sh", *SIM]),
    ("space dir", [*SEARCH, "--space", "{D}/dir"]),
    ("space dir.yaml", [*SEARCH, "--space", "{D}/dir.yaml"]),
    ("cluster dir.yaml", [*SEARCH, "--cluster", "{D}/dir.yaml"]),
    ("calibration dir", [*SEARCH, "--calibration", "{D}/dir"]),
    ("layout dir", ["estimate", "gpt2", "--gpus", "1", "--layout", "{D}/dir"]),
    ("from-megatron dir", ["--from-megatron", "{D}/dir", *SIM]),
    ("model dir.yaml", ["estimate", "{D}/dir.yaml", "--gpus", "1"]),
    ("calibrate -o dir", ["calibrate", "--results-dir", "{D}/study", "-o", "{D}/dir"]),
    ("calibrate --results-dir file", ["calibrate", "--results-dir", "{D}/empty.json"]),
    ("report --results-dir file", ["report", "--results-dir", "{D}/empty.json"]),
    ("search --results-dir empty.json", [*SEARCH, "--results-dir", "{D}/empty.json"]),
    # the session's three named defects
    ("cluster 8e0 / 4.5e2", ["estimate", "gpt2", "--gpus", "8", "--cluster", "{D}/cl_1e3.yaml"]),
    ("layout 1e0 / 6.4e1", ["estimate", "gpt2", "--gpus", "8", "--layout", "{D}/layout_1e3.json"]),
    ("--megatron-lm /nonexistent simulate", [*SEARCH, "--megatron-lm", "/nonexistent"]),
    ("--megatron-lm /nonexistent --dry-run", ["gpt2", "--gpus", "1", *SIM, "--dry-run",
                                              "--megatron-lm", "/nonexistent"]),
    ("--time-budget inf", [*SEARCH, "--time-budget", "inf"]),
    ("--time-budget -inf", [*SEARCH, "--time-budget", "-inf"]),
    ("--time-budget 1e400", [*SEARCH, "--time-budget", "1e400"]),
    ("--trial-timeout 1e300", [*SEARCH, "--trial-timeout", "1e300"]),
]


def run(args: list[str], name: str) -> dict[str, object]:
    own = D / "r" / str(abs(hash(name)))
    args = [a.replace("{D}", str(D)) for a in args]
    searches = args and args[0] not in ("estimate", "export", "report", "calibrate", "models")
    if searches and "--results-dir" not in args and "--dry-run" not in args:
        args += ["--results-dir", str(own)]
    env = {**os.environ, "PYTHONPATH": str(TREE), "COLUMNS": "200"}
    try:
        proc = subprocess.run([AUTOTUNE, *args], capture_output=True, text=True, env=env,
                              timeout=300, cwd=D)
        code, err, out = proc.returncode, proc.stderr, proc.stdout
    except subprocess.TimeoutExpired:
        code, err, out = "timeout", "", ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
    return {"case": name, "code": code, "stderr_lines": len(lines),
            "first": first[:240], "traceback": "Traceback" in err,
            "stdout": out.strip().splitlines()[0][:120] if out.strip() else "",
            "pwned": (D / "PWNED").exists(),
            "mine_kept": (D / "mine.sh").read_text() == FILES["mine.sh"]}


def main() -> None:
    setup()
    with ThreadPoolExecutor(2) as pool:
        rows = list(pool.map(lambda c: run(c[1], c[0]), CASES))
    OUT.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    for r in rows:
        print(f"{r['code']!s:>4} tb={int(bool(r['traceback']))} {r['case']}: {r['first']}")


if __name__ == "__main__":
    main()
