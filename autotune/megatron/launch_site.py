"""Where a user's script launches pretrain_gpt.py, found with a real shell parser; nothing runs.

`read_script` reads the file with bounded work (a regular file, at most MAX_SCRIPT_BYTES, UTF-8),
`parse_script` parses it with tree-sitter's bash grammar (the parser editors use for bash; it
reads here-documents, arrays, `[[ ]]`, `case`, arithmetic, functions) within PARSE_SECONDS and
MAX_NESTING, and `find_launch` picks the one command that launches the training script. A launch
the shell might not run as written (in an if/case branch, a loop, a function body, after `||`,
in here-document text) or several launches are refused in one line naming the candidate lines,
unless the user names the line (`--line N`): autotune then edits only that command, so the
context it runs in (`cd`, `source`, exports, defaults) stays the user's.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from autotune.errors import ConfigError
from autotune.inputs.files import read_bytes
from autotune.inputs.untrusted import for_terminal
from autotune.megatron.megatron_args import TRAINING_SCRIPT

__all__ = ["MAX_NESTING", "MAX_SCRIPT_BYTES", "NOT_RUN", "PARSE_SECONDS", "Candidate",
           "Script", "context_of", "find_launch", "parse_script", "read_script", "walk"]

MAX_SCRIPT_BYTES = 256 * 1024
"""A launch script is a few kilobytes; tree-sitter takes about 1.5 s per MiB of bash."""
MAX_NESTING = 200
"""Syntax nodes inside one another (`${A:-${A:-...}}`, `$( $( ... ) )`): real scripts nest a
handful deep."""
PARSE_SECONDS = 5.0
"""The most the parser may take on one file (it takes milliseconds on a launch script)."""

NOT_RUN = frozenset({"echo", "printf", "cat", "grep", "tee", "sed", "awk", "ls", "test", "["})
"""Commands that mention pretrain_gpt.py without running it (a log line, a listing)."""

_LANGUAGE = Language(tree_sitter_bash.language())

# Constructs whose commands the shell may not run, or runs a number of times autotune cannot
# know: a launch inside one is refused unless --line names it.
_CONDITIONAL = {
    "if_statement": "inside an if",
    "case_statement": "inside a case",
    "function_definition": "inside a function",
    "for_statement": "inside a loop",
    "c_style_for_statement": "inside a loop",
    "while_statement": "inside a loop",
    "command_substitution": "inside a $(...)",
    "process_substitution": "inside a <(...)",
}


@dataclass(frozen=True, slots=True)
class Script:
    """A script's bytes (what an edit patches), its text, and its syntax tree."""

    source: str
    data: bytes
    root: Node

    @property
    def text(self) -> str:
        return self.data.decode("utf-8")

    def raw(self, node: Node) -> str:
        return self.data[node.start_byte:node.end_byte].decode("utf-8")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A place that may launch the training script: its lines (1-based), why the shell may not
    run it as written (None: it runs whenever the script gets there) and its command node (None
    for here-document text)."""

    line: int
    end_line: int
    where: str | None
    node: Node | None

    def describe(self) -> str:
        return f"line {self.line}" + (f" ({self.where})" if self.where else "")


def read_script(path: str, what: str = "Megatron-LM command file") -> bytes:
    """The bytes of a regular file of at most MAX_SCRIPT_BYTES, UTF-8; anything else is one line
    (autotune.inputs.files, the one reader of input files: a FIFO is refused, not waited on)."""
    return read_bytes(path, what, max_bytes=MAX_SCRIPT_BYTES)


def walk(node: Node) -> Iterator[tuple[Node, int]]:
    """Every node under `node` with its depth, in document order, without recursion (a deeply
    nested file must not exhaust Python's stack)."""
    stack = [(node, 0)]
    while stack:
        current, depth = stack.pop()
        yield current, depth
        stack.extend((child, depth + 1) for child in reversed(current.children))


def parse_script(data: bytes, source: str) -> Script:
    """The script's syntax tree, or one line: too slow to parse, too deeply nested, or bash
    the grammar does not read (refused rather than guessed at)."""
    crlf = data.find(b"\r\n")
    if crlf >= 0:
        # bash keeps the carriage return in the line's last word (`--bf16\r`, which Megatron-LM's
        # argparse refuses) and does not join a `\` continuation followed by one, so the command
        # would run split at that line; tree-sitter-bash reads it as white space and would read
        # another command than bash runs.
        line = data.count(b"\n", 0, crlf) + 1
        raise ConfigError(f"{source}: line {line} ends in a carriage return (Windows line "
                          "endings): bash does not run this script as written; convert it "
                          f"(dos2unix {shlex.quote(source)}) and run autotune again")
    deadline = time.monotonic() + PARSE_SECONDS
    parser = Parser(_LANGUAGE)
    try:
        tree = parser.parse(lambda offset, _point: data[offset:offset + 65536],
                            progress_callback=lambda _offset, _error: time.monotonic() > deadline)
    except ValueError:  # the progress callback cancelled it
        raise ConfigError(f"{source}: parsing took longer than {PARSE_SECONDS:g} s; a launch "
                          "script parses in milliseconds") from None
    root = tree.root_node
    for node, depth in walk(root):
        if depth > MAX_NESTING:
            raise ConfigError(f"{source}: line {node.start_point[0] + 1}: the script nests "
                              f"deeper than {MAX_NESTING} levels")
        if root.has_error and (node.is_error or node.is_missing):
            raise ConfigError(f"{source}: line {node.start_point[0] + 1}: bash syntax autotune's "
                              "parser (tree-sitter-bash) does not read")
    script = Script(source=source, data=data, root=root)
    _refuse_broken_continuation(script)
    return script


def _refuse_broken_continuation(script: Script) -> None:
    """A line ending in `\\` and white space (an escaped space, not a continuation) ends the
    command there: bash runs the next line, which starts with a flag, as a command of its own.
    Read as bash runs it, the launch would lack that line's flags (one line naming the cause
    rather than "the command has no --seq-length")."""
    lines = script.data.split(b"\n")
    for node, _ in walk(script.root):
        row = node.start_point[0]
        if node.type != "command" or row == 0:
            continue
        name = _command_name(script, node) or ""
        if not name.startswith("-"):
            continue
        previous = lines[row - 1]
        stripped = previous.rstrip(b" \t")
        if stripped != previous and stripped.endswith(b"\\"):
            raise ConfigError(f"{script.source}: line {row} ends in a backslash and white "
                              "space, not a line continuation: bash ends the command there and "
                              f"runs line {row + 1} ({for_terminal(name)[:40]} ...) as a "
                              "command of its own; remove the white space after the backslash "
                              "and run autotune again")


def context_of(node: Node) -> str | None:
    """Why the shell may not run `node` whenever the script reaches it (the outermost reason),
    or None."""
    reason = None
    child, parent = node, node.parent
    while parent is not None:
        why = _CONDITIONAL.get(parent.type)
        if parent.type == "list":
            # `a || b`: b runs only when a fails; `cd DIR && torchrun ...` is the normal path.
            ops = [c for c in parent.children if c.start_byte < child.start_byte
                   and c.type in ("||", "&&")]
            if ops and ops[-1].type == "||":
                why = "after ||"
        if why is not None:
            reason = why
        child, parent = parent, parent.parent
    return reason


def _mentions_script(script: Script, node: Node) -> bool:
    return script.raw(node).strip("'\"").endswith(TRAINING_SCRIPT)


def _command_name(script: Script, command: Node) -> str | None:
    name = command.child_by_field_name("name")
    return None if name is None else script.raw(name)


_RUN_THEIR_INPUT = frozenset({"sbatch", "bash", "sh", "srun"})
"""Commands that run the script a here-document feeds them (`sbatch <<EOF`): the launch in it
runs, but as another script than the one autotune reads and edits."""


def _heredoc_reader(script: Script, body: Node) -> str | None:
    """The command a here-document's text is fed to (`sbatch` of `sbatch <<EOF`), or None."""
    node = body.parent
    while node is not None and node.type != "redirected_statement":
        node = node.parent
    if node is None:
        return None
    command = next((c for c in node.children if c.type == "command"), None)
    name = None if command is None else _command_name(script, command)
    return None if name is None else name.rsplit("/", 1)[-1]


def _candidates(script: Script, evaluated_lines: Mapping[int, str | None]) -> list[Candidate]:
    found: dict[int, Candidate] = {}  # by the command node's start byte
    commands_at: dict[int, list[Node]] = {}
    for node, _ in walk(script.root):
        line = node.start_point[0] + 1
        if node.type == "heredoc_body" and TRAINING_SCRIPT in script.raw(node):
            fed = _heredoc_reader(script, node)
            where = (f"in here-document text fed to {fed}" if fed in _RUN_THEIR_INPUT
                     else "in here-document text")
            found[node.start_byte] = Candidate(line, node.end_point[0] + 1, where, None)
        if node.type != "command" or _command_name(script, node) in NOT_RUN:
            continue
        commands_at.setdefault(line, []).append(node)
        if any(_mentions_script(script, c) for c in node.children
               if not c.type.endswith("redirect")):
            found[node.start_byte] = Candidate(line, node.end_point[0] + 1, context_of(node),
                                               node)
    # A launch the evaluator found by expanding (`eval $cmd`, `$CMD`, `srun ... sh -c "$CMD"`):
    # the command that starts on its line, not one inside it (`$(pwd)` in the sh -c string),
    # named as the evaluator read its first word (`cd DIR && srun ... && mv log old`), else
    # the last one there (`cd DIR && eval $cmd`).
    for line, first in evaluated_lines.items():
        nodes = commands_at.get(line, [])
        outer = [n for n in nodes if not any(
            o is not n and o.start_byte <= n.start_byte and n.end_byte <= o.end_byte
            for o in nodes)]
        named = [n for n in outer if first is not None and _command_name(script, n) == first]
        if outer and not any(n.start_byte in found for n in nodes):
            node = (named or outer)[-1]
            found[node.start_byte] = Candidate(line, node.end_point[0] + 1, context_of(node),
                                               node)
    return sorted(found.values(), key=lambda c: (c.line, c.end_line))


def _refuse_heredoc(script: Script, candidate: Candidate) -> None:
    """One line for a launch in a here-document that a command runs (`sbatch <<EOF`): that
    job script is where it runs; autotune reads and edits a file."""
    where = candidate.where or ""
    fed = where.rsplit(" ", 1)[-1] if where.startswith("in here-document text fed to") \
        else None
    if fed is not None:
        raise ConfigError(f"{script.source}: lines {candidate.line}-{candidate.end_line}: "
                          f"the launch is in a here-document fed to {fed}, a job script "
                          "written when this one "
                          "runs; save that job script as a file (`sbatch FILE`) and pass it "
                          "to --from-megatron")


def find_launch(script: Script, evaluated_lines: Mapping[int, str | None],
                line: int | None) -> Candidate | None:
    """The command that launches the training script (None: there is none). `evaluated_lines`
    are the lines where the evaluator (autotune.megatron.shell_script) found a launch once
    variables were expanded, each with the first word of the command it read there (None where
    it is not plain text); `line` is the user's `--line N`."""
    candidates = _candidates(script, evaluated_lines)
    listed = ", ".join(c.describe() for c in candidates)
    if line is not None:
        chosen = [c for c in candidates if c.line <= line <= c.end_line]
        if not chosen:
            raise ConfigError(f"{script.source}: --line {line} holds no {TRAINING_SCRIPT} launch"
                              + (f" (candidates: {listed})" if candidates else ""))
        if len(chosen) > 1:
            raise ConfigError(f"{script.source}: line {line} holds several {TRAINING_SCRIPT} "
                              f"launches ({listed}); put them on lines of their own")
        if chosen[0].node is None:
            _refuse_heredoc(script, chosen[0])
            raise ConfigError(f"{script.source}: line {line} is here-document text, which the "
                              "script writes or feeds to a command; autotune edits a command "
                              "the script runs itself")
        return chosen[0]
    if not candidates:
        return None
    if len(candidates) == 1 and candidates[0].node is None:
        _refuse_heredoc(script, candidates[0])
    if len(candidates) == 1 and candidates[0].where is None:
        return candidates[0]
    what = "several places may launch" if len(candidates) > 1 else \
        "the shell may not run the launch of"
    raise ConfigError(f"{script.source}: {what} {TRAINING_SCRIPT} ({listed}); name the one "
                      "that runs with --line N")
