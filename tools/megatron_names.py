"""Dump the names a megatron-core release and its Megatron-LM tag declare, for
tests/data/megatron_versions/ (what tests/test_megatron_versions.py holds the version table
against).

    python tools/megatron_names.py --megatron-lm DIR --wheel FILE --tag TAG > OUT.json

DIR is a Megatron-LM checkout at the release's tag (`git archive core_v0.19.0 megatron | tar -x`);
its megatron/training/arguments.py builds the parser whose option strings are listed, so it must
import: torch, plus the modules Megatron-LM's training code imports (six, triton, regex, ...).
FILE is the megatron-core wheel of the release: the config dataclasses' fields (with their
defaults as written) are read from its source without importing it, and its METADATA gives the
declared Python, torch and Transformer Engine requirements. Names only, no code of Megatron's.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import typing
import warnings
import zipfile
from pathlib import Path

CONFIG_CLASSES = {
    "ModelParallelConfig": "megatron/core/model_parallel_config.py",
    "TransformerConfig": "megatron/core/transformer/transformer_config.py",
    "DistributedDataParallelConfig":
        "megatron/core/distributed/distributed_data_parallel_config.py",
    "OptimizerConfig": "megatron/core/optimizer/optimizer_config.py",
}
DEFAULT_CHARS = 60


def config_fields(source: str, cls: str) -> dict[str, str]:
    """A dataclass's annotated fields and their defaults as written (shortened)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {st.target.id: ast.unparse(st.value)[:DEFAULT_CHARS] if st.value else ""
                    for st in node.body
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
    raise SystemExit(f"no class {cls} in the wheel")


def wheel_facts(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
        fields = {cls: config_fields(z.read(path).decode(), cls)
                  for cls, path in CONFIG_CLASSES.items()}
    version = next(line.split(": ", 1)[1] for line in lines if line.startswith("Version: "))
    python = next(line.split(": ", 1)[1] for line in lines
                  if line.startswith("Requires-Python: "))
    requires = [line.split(": ", 1)[1] for line in lines if line.startswith("Requires-Dist: ")]
    return {"version": version, "requires_python": python,
            "torch": next(r for r in requires if r.startswith("torch")),
            "transformer_engine": sorted(r for r in requires
                                         if r.startswith("transformer-engine")),
            "fields": fields}


def parser_flags(checkout: Path) -> list[str]:
    """Every option string of Megatron-LM's pretrain parser at the checkout."""
    if not hasattr(typing, "override"):  # Python 3.12's no-op decorator, for 3.11 readers
        typing.override = lambda f: f  # type: ignore[attr-defined]
    sys.path.insert(0, str(checkout))
    warnings.simplefilter("ignore")
    from megatron.training import arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser = arguments.add_megatron_arguments(parser) or parser
    return sorted(o for action in parser._actions for o in action.option_strings
                  if o.startswith("--"))


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--megatron-lm", type=Path, required=True)
    cli.add_argument("--wheel", type=Path, required=True)
    cli.add_argument("--tag", required=True, help="Megatron-LM's git tag the checkout is at")
    args = cli.parse_args()
    facts = wheel_facts(args.wheel)
    out = {"provenance": f"megatron-core {facts['version']} wheel ({args.wheel.name}) and "
                         f"Megatron-LM {args.tag} megatron/training/arguments.py, read by "
                         "tools/megatron_names.py",
           **facts, "flags": parser_flags(args.megatron_lm)}
    json.dump(out, sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
