"""Record the values Megatron-LM's parser accepts for each flag, for
autotune/megatron/flag_values.json (what `--from-megatron` checks the flags it carries against).

    python tools/megatron_values.py GIT_DIR RELEASE=TAG ... > autotune/megatron/flag_values.json

GIT_DIR is a Megatron-LM git directory; TAG the release's tag (core_v0.16.1). Its
megatron/training/arguments.py is read without importing it: each `add_argument('--flag', ...)`
call with literal option strings gives the flag's `type` when it is int or float, its literal
`choices`, and whether it takes a value (store_true and the other constant actions take none);
each `ArgumentGroupFactory(Config)` gives its dataclass's fields (bases' too) as
megatron/training/argument_utils.py turns them into flags: `int`/`float`/`Literal[...]`/an Enum
(its member names)/`list[...]`, `Optional` of those, `bool` as store_true (`--no-`/`--disable-`
store_false when it defaults to True), `metadata={"argparse_meta": {...}}` over them. A flag's
explicit add_argument wins over a field's; only the flags tests/data/megatron_versions/RELEASE.json
lists (the release's parser, run) are kept. Types given by a function, unions and metadata that
is not a literal are not recorded, so they are not checked. Names and literals only, no code of
Megatron's.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

_NO_VALUE = {"store_true", "store_false", "store_const", "count"}


def flag_values(source: str) -> dict[str, dict[str, Any]]:
    """flag -> {"type": "int"|"float", "choices": [...], "takes_value": false}, the checkable
    parts only ({} for a flag with none)."""
    out: dict[str, dict[str, Any]] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)
                 and a.value.startswith("--")]
        if not names:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        record: dict[str, Any] = {}
        action = kw.get("action")
        if isinstance(action, ast.Constant) and action.value in _NO_VALUE:
            record["takes_value"] = False
        elif action is None or (isinstance(action, ast.Constant) and action.value in
                                ("store", "append", "extend")):
            kind = kw.get("type")
            if isinstance(kind, ast.Name) and kind.id in ("int", "float"):
                record["type"] = kind.id
            if "choices" in kw:
                try:
                    choices = ast.literal_eval(kw["choices"])
                except ValueError:
                    choices = None
                if isinstance(choices, (list, tuple)) and all(
                        isinstance(c, (str, int, float)) for c in choices):
                    record["choices"] = [str(c) for c in choices]
        for name in names:
            out[name] = record  # {} for a flag with nothing checkable: it hides a field's
    return dict(sorted(out.items()))


class _Tree:
    """A Megatron-LM tag's Python sources, read by class name."""

    def __init__(self, git_dir: str, tag: str) -> None:
        self.git_dir, self.tag = git_dir, tag
        self.classes: dict[str, ast.ClassDef | None] = {}

    def show(self, path: str) -> str:
        return subprocess.run(["git", "--git-dir", self.git_dir, "show", f"{self.tag}:{path}"],
                              check=True, capture_output=True, text=True).stdout

    def cls(self, name: str) -> ast.ClassDef | None:
        if name not in self.classes:
            hits = subprocess.run(["git", "--git-dir", self.git_dir, "grep", "-l",
                                   f"^class {name}\\b", self.tag, "--", "megatron"],
                                  capture_output=True, text=True).stdout.split()
            found = None
            for hit in hits:
                tree = ast.parse(self.show(hit.split(":", 1)[1]))
                found = next((n for n in tree.body
                              if isinstance(n, ast.ClassDef) and n.name == name), None)
                if found is not None:
                    break
            self.classes[name] = found
        return self.classes[name]


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else ""


def _annotation(node: ast.expr, tree: _Tree) -> dict[str, Any] | None:
    """argparse's type/choices for a field's annotation, as argument_utils infers them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if isinstance(node.right, ast.Constant) and node.right.value is None:
            return _annotation(node.left, tree)
        return None
    if isinstance(node, ast.Subscript):
        outer = _name(node.value)
        inner = node.slice
        if outer == "Optional":
            return _annotation(inner, tree)
        if outer in ("List", "list"):
            return _annotation(inner, tree)
        if outer == "Literal":
            items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            if all(isinstance(i, ast.Constant) for i in items):
                values = [i.value for i in items if isinstance(i, ast.Constant)]
                kinds = {type(v) for v in values}
                out: dict[str, Any] = {"choices": [str(v) for v in values]}
                if kinds == {int}:
                    out["type"] = "int"
                return out
        return None
    name = _name(node)
    if name in ("int", "float"):
        return {"type": name}
    if name == "bool":
        return {"bool": True}
    if name == "str":
        return {}
    enum = tree.cls(name) if name and name[0].isupper() else None
    if enum is not None and any("Enum" in _name(b) for b in enum.bases):
        members = [t.id for st in enum.body if isinstance(st, ast.Assign)
                   for t in st.targets if isinstance(t, ast.Name)]
        return {"choices": members} if members else None
    return None


def _fields(cls: ast.ClassDef, tree: _Tree) -> dict[str, dict[str, Any]]:
    """The flags a config dataclass's fields become (its bases' first)."""
    out: dict[str, dict[str, Any]] = {}
    for base in cls.bases:
        parent = tree.cls(_name(base))
        if parent is not None:
            out.update(_fields(parent, tree))
    for st in cls.body:
        if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(st.annotation):
            continue
        default: ast.expr | None = st.value
        meta: dict[str, Any] | None = {}
        if isinstance(default, ast.Call) and _name(default.func) == "field":
            kw = {k.arg: k.value for k in default.keywords if k.arg}
            init = kw.get("init")
            if isinstance(init, ast.Constant) and init.value is False:
                continue
            default = kw.get("default")
            if "metadata" in kw:
                try:
                    meta = ast.literal_eval(kw["metadata"]).get("argparse_meta", {})
                except ValueError:
                    meta = None  # metadata autotune cannot read: not recorded
        if meta is None:
            continue
        record = _annotation(st.annotation, tree)
        names = ["--" + st.target.id.replace("_", "-")]
        if record is not None and record.pop("bool", False):
            if not (isinstance(default, ast.Constant) and isinstance(default.value, bool)):
                continue
            record = {"takes_value": False}
            if default.value:
                names = ["--no-" + names[0][2:], "--disable-" + names[0][2:]]
        names = meta.get("arg_names", names)
        if "action" in meta:
            record = {"takes_value": False} if meta["action"] in _NO_VALUE else None
        if "type" in meta or "nargs" in meta:
            record = None  # given by Megatron's own code, not a literal here
        if record is not None and "choices" in meta:
            record["choices"] = [str(c) for c in meta["choices"]]
        for name in names:
            out.pop(name, None)
            if record:
                out[name] = record
    return out


def release_values(git_dir: str, tag: str, release: str) -> dict[str, dict[str, Any]]:
    """What a release's parser accepts per flag: its config dataclasses' flags, then its
    explicit add_argument calls over them."""
    tree = _Tree(git_dir, tag)
    source = tree.show("megatron/training/arguments.py")
    out: dict[str, dict[str, Any]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _name(node.func) == "ArgumentGroupFactory" \
                and node.args:
            cls = tree.cls(_name(node.args[0]))
            if cls is not None:
                out.update(_fields(cls, tree))
    out.update(flag_values(source))
    # Only the flags the release's parser declares (a field its factory excludes is none).
    declared = json.loads((Path(__file__).parents[1] / "tests/data/megatron_versions"
                           / f"{release}.json").read_text())["flags"]
    return {name: out[name] for name in sorted(out) if out[name] and name in declared}


def main() -> None:
    git_dir = sys.argv[1]
    releases = dict(arg.split("=", 1) for arg in sys.argv[2:])
    out = {"provenance": "Megatron-LM megatron/training/arguments.py and its config dataclasses "
                         "per release (" + ", ".join(f"{r}: {t}" for r, t in releases.items())
                         + "), read by tools/megatron_values.py",
           "releases": {r: release_values(git_dir, t, r) for r, t in releases.items()}}
    json.dump(out, sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
