"""Where a user's script launches pretrain_gpt.py, found with a real shell parser; nothing runs.

`read_script` reads the file with bounded work (a regular file, at most MAX_SCRIPT_BYTES, UTF-8),
`parse_script` parses it with tree-sitter's bash grammar (the parser editors use for bash; it
reads here-documents, arrays, `[[ ]]`, `case`, arithmetic, functions) within PARSE_SECONDS and
MAX_NESTING, and `find_launch` picks the one command that launches the training script. A launch
the shell might not run as written (in an if/case branch, a loop, a function body, after `||`,
in here-document text) or several launches are refused in one line naming the candidate lines,
unless the user names the line (`--line N`): autotune then edits only that command, so the
context it runs in (`cd`, `source`, exports, defaults) stays the user's. The one here-document
read is the job script of `sbatch <<EOF` (`sbatch_heredocs`; also as the one command of a
`JOBID=$(sbatch --parsable <<EOF ...)`): its launch is read (Candidate.job_script), never
edited.
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
from autotune.megatron.shell_script import HereDoc

__all__ = ["MAX_NESTING", "MAX_SCRIPT_BYTES", "NOT_RUN", "PARSE_SECONDS", "Candidate",
           "Script", "context_of", "find_launch", "parse_script", "read_script",
           "sbatch_heredocs", "walk"]

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
    job_script: bool = False
    """A launch in the job script of `sbatch <<EOF` (node None): read, not edited."""

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


def _heredoc_command(body: Node) -> Node | None:
    """The command node a here-document's text is fed to (`sbatch` of `sbatch <<EOF`, and of
    `cd DIR && sbatch <<EOF`, which tree-sitter-bash reads as the list redirected: bash gives
    the here-document to the list's last command)."""
    node = body.parent
    while node is not None and node.type != "redirected_statement":
        node = node.parent
    if node is None:
        return None
    command = next((c for c in node.children if c.type in ("command", "list")), None)
    while command is not None and command.type == "list":
        command = next((c for c in reversed(command.children)
                        if c.type in ("command", "list")), None)
    return command


def _heredoc_reader(script: Script, body: Node) -> str | None:
    """The command a here-document's text is fed to (`sbatch` of `sbatch <<EOF`), or None."""
    command = _heredoc_command(body)
    name = None if command is None else _command_name(script, command)
    return None if name is None else name.rsplit("/", 1)[-1]


def _sbatch_statement(script: Script, body: Node) -> Node | None:
    """The `sbatch` command a here-document is the job script of (None: another command's,
    or not sbatch's standard input)."""
    redirect = body.parent
    statement = None if redirect is None else redirect.parent
    if redirect is None or redirect.type != "heredoc_redirect" or statement is None \
            or statement.type != "redirected_statement":
        return None
    return _heredoc_command(body) if _heredoc_reader(script, body) == "sbatch" else None


def _submission(statement: Node) -> Node:
    """The node whose place says whether the `sbatch` of a job script runs: the `$(...)` of
    `JOBID=$(sbatch --parsable <<EOF ...)` where that sbatch is its one command (the
    substitution runs the sbatch wherever the assignment runs; the evaluator reads that form
    alone, shell_script._Reader.submission), else the sbatch itself."""
    redirected = statement.parent
    outer = None if redirected is None else redirected.parent
    if redirected is None or outer is None or redirected.type != "redirected_statement" \
            or outer.type != "command_substitution":
        return statement
    inside = [c for c in outer.children if c.type not in ("$(", ")", "comment")]
    return outer if inside == [redirected] else statement


def sbatch_heredocs(script: Script) -> dict[int, HereDoc]:
    """The job scripts of `sbatch <<EOF` here-documents, by the line of their `sbatch` (where
    the evaluator meets the command): their text from the line after `<<EOF` to the line
    before the delimiter."""
    out: dict[int, HereDoc] = {}
    data = script.data
    for node, _ in walk(script.root):
        if node.type != "heredoc_body":
            continue
        statement = _sbatch_statement(script, node)
        redirect = node.parent
        if statement is None or redirect is None:
            continue
        start = next((c for c in redirect.children if c.type == "heredoc_start"), None)
        end = next((c for c in redirect.children if c.type == "heredoc_end"), None)
        if start is None or end is None:
            continue
        first = data.rfind(b"\n", 0, node.start_byte) + 1
        last = data.rfind(b"\n", 0, end.start_byte) + 1
        text = data[first:last].decode("utf-8")
        if any(c.type == "<<-" for c in redirect.children):
            text = "\n".join(line.lstrip("\t") for line in text.split("\n"))
        delimiter = script.raw(start)
        out[statement.start_point[0] + 1] = HereDoc(
            text, node.start_point[0] + 1, not any(q in delimiter for q in "'\"\\"))
    return out


def _candidates(script: Script, evaluated_lines: Mapping[int, str | None],
                job_lines: Mapping[int, bool]) -> list[Candidate]:
    found: dict[int, Candidate] = {}  # by the command node's start byte
    commands_at: dict[int, list[Node]] = {}
    for node, _ in walk(script.root):
        line = node.start_point[0] + 1
        end_line = node.end_point[0] + 1
        statement = _sbatch_statement(script, node) if node.type == "heredoc_body" else None
        inside = [] if statement is None else sorted(
            k for k in job_lines if line <= k <= end_line)
        if statement is not None and inside:
            # The job script of `sbatch <<EOF`, read by the evaluator: its launches, which run
            # when sbatch does (and when the job script gets there).
            for k, at in enumerate(inside):
                where = context_of(_submission(statement)) or (
                    "inside an if/for/case block or a function of the sbatch job script"
                    if job_lines[at] else None)
                upto = inside[k + 1] - 1 if k + 1 < len(inside) else end_line
                found[node.start_byte + k] = Candidate(at, upto, where, None, job_script=True)
            continue
        if node.type == "heredoc_body" and TRAINING_SCRIPT in script.raw(node):
            fed = _heredoc_reader(script, node)
            where = (f"in here-document text fed to {fed}" if fed in _RUN_THEIR_INPUT
                     else "in here-document text")
            found[node.start_byte] = Candidate(line, end_line, where, None)
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
                line: int | None, job_lines: Mapping[int, bool] | None = None
                ) -> Candidate | None:
    """The command that launches the training script (None: there is none). `evaluated_lines`
    are the lines where the evaluator (autotune.megatron.shell_script) found a launch once
    variables were expanded, each with the first word of the command it read there (None where
    it is not plain text); `job_lines` those it found in an `sbatch <<EOF` job script, each
    with whether it is inside a block there; `line` is the user's `--line N`."""
    candidates = _candidates(script, evaluated_lines, job_lines or {})
    listed = ", ".join(c.describe() for c in candidates)
    if line is not None:
        chosen = [c for c in candidates if c.line <= line <= c.end_line]
        if not chosen:
            raise ConfigError(f"{script.source}: --line {line} holds no {TRAINING_SCRIPT} launch"
                              + (f" (candidates: {listed})" if candidates else ""))
        if len(chosen) > 1:
            raise ConfigError(f"{script.source}: line {line} holds several {TRAINING_SCRIPT} "
                              f"launches ({listed}); put them on lines of their own")
        if chosen[0].node is None and not chosen[0].job_script:
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
