"""A user's launch script with only the changed flag values edited in place; every other byte kept.

`patch_script` takes the script as read by autotune.megatron.megatron_command (its syntax tree and
launch command) and the rows of the flag table a better layout changes, and edits the file's bytes:
- a flag written in the launch command, or in an array the command expands (`"${ARGS[@]}"`,
  `ARGS=( ... )` set once, unconditionally, before the launch, plus `ARGS+=( ... )`), or in a
  string it expands (`$PARALLEL`, `eval $cmd`) set the same way: its value word is replaced
  where it stands. A value the command takes from a variable (`--tensor-model-parallel-size
  $TP`) is replaced by the number in the command itself, not in `TP=...`: the variable may name
  a checkpoint folder or feed other arithmetic, which the new layout must not change;
- a flag the new layout adds goes onto the launch command, after its last argument;
- a flag it drops is taken out (with the space or line continuation before it).
A flag the user's command gets from somewhere autotune does not follow (a variable set in an
`if`, the environment, a `$(...)`) is refused in one line: an edit there could change more
than the flag, and leaving it would run the old layout.

With a megatron-core release named (`export --megatron-version X`), the user's other flags are
respelled for it where they stand (autotune.megatron.megatron_versions: a renamed flag takes the
release's name, one it removed goes with its value, one it lacks is refused): `respellings`
says which, `patch_script` edits them with the layout's flags.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass

from tree_sitter import Node

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.megatron.identity import run_key
from autotune.megatron.launch_site import Script, context_of, walk
from autotune.megatron.megatron_args import (
    FLAG_TABLE,
    PIPELINE_LAYOUT,
    TRAINING_SCRIPT,
    Flag,
    row_args,
)
from autotune.megatron.megatron_command import (
    MegatronCommand,
    RowChange,
    exported_layout,
    flag_values,
    megatron_layout,
    read_megatron_command,
)
from autotune.megatron.megatron_versions import MegatronVersion, spell_args
from autotune.megatron.pipeline_layout import string_split
from autotune.megatron.shell_script import SCRIPT_ARGUMENTS, shell_c_at

__all__ = ["Respelling", "Token", "launch_tokens", "patch_script", "respellings"]

_MAX_FOLLOW = 16
"""Variables followed inside one another (`ARGS=( "${MODEL[@]}" ... )`)."""
_PLAIN = re.compile(r"[A-Za-z0-9_.,:+=/@%-]+")
"""Text that means the same bare, in double quotes or in single quotes."""
_REDIRECTS = {"file_redirect", "heredoc_redirect", "herestring_redirect"}
_DEFERRED = re.compile(r"\\\$(?:\{[A-Za-z_][A-Za-z0-9_]*(?::?[-=+?][^}\s'\"\\`$]*)?\}"
                       r"|[A-Za-z_][A-Za-z0-9_]*)")
"""`\\$NAME`, `\\${NAME:-1}` in a double-quoted string: left for the new shell to expand (its
environment's SLURM_NNODES), with nothing in it that it lexes otherwise."""
_CONTINUATION = re.compile(r"(?<=[ \t])\\\n|\\\n(?=[ \t\n])")
"""A backslash-newline with a blank beside it, inside a string: a blank to the word split."""


@dataclass(frozen=True, slots=True)
class Token:
    """One word of the launch command as bash splits it, with where it stands in the file."""

    text: str | None
    """Its literal text (None where part of it is an expansion autotune does not follow)."""
    head: str
    """The literal text it starts with (`--tp=` of `--tp=$TP`)."""
    start: int
    end: int
    """Its bytes in the file."""
    quoting: str
    """The quoting it stands in: "" (a word of a command or array), '"' or "'" (inside such
    a string, where only plain text can replace it)."""


# ---- words as bash splits them -------------------------------------------------------------


def _literal(script: Script, node: Node) -> str | None:
    """A word node's text when it holds no expansion (quotes and backslashes removed)."""
    kind = node.type
    raw = script.raw(node)
    if kind in ("word", "number"):
        return None if "$" in raw or "`" in raw else re.sub(r"\\(.)", r"\1", raw, flags=re.S)
    if kind == "raw_string":
        return raw[1:-1]
    if kind == "string":
        inner = [c for c in node.children if c.type not in ('"',)]
        if all(c.type == "string_content" for c in inner):
            return re.sub(r'\\([$`"\\])', r"\1", raw[1:-1]).replace("\\\n", "")
        return None
    if kind == "concatenation":
        parts = [_literal(script, c) for c in node.children]
        return None if any(p is None for p in parts) else "".join(p or "" for p in parts)
    return None


def _head(script: Script, node: Node) -> str:
    if node.type == "concatenation" and node.children:
        return _head(script, node.children[0])
    return _literal(script, node) or ""


class _Follower:
    """Turns the launch command's word nodes into tokens, following the variables it expands
    where their value is known without running anything."""

    def __init__(self, script: Script, launch: Node,
                 left_out: frozenset[tuple[str, int]] = frozenset()) -> None:
        self.script = script
        self.launch = launch
        self.left_out = left_out
        """(array, line) of the appends inside a block that the reader read the command
        without (MegatronCommand.maybe: flags autotune neither reads nor needs): they add no
        token, as they add no word to what autotune read."""
        self.assignments: dict[str, list[Node]] = {}
        for node, _ in walk(script.root):
            if node.type == "variable_assignment":
                name = node.child_by_field_name("name")
                if name is not None:
                    self.assignments.setdefault(script.raw(name), []).append(node)
        self.following: list[str] = []

    def word(self, node: Node, *, command: bool = False) -> list[Token]:
        """The tokens of one word of the command or of an array (`command`: a word `eval`
        runs, whose variable may hold the whole launch without a flag written in it)."""
        name, array = self._reference(node)
        if name is not None:
            followed = self.follow(name, array=array, command=command)
            if followed is not None:
                return followed
        text = _literal(self.script, node)
        return [Token(text, _head(self.script, node), node.start_byte, node.end_byte, "")]

    @staticmethod
    def _variable(node: Node) -> tuple[str | None, bool]:
        """(NAME, whether all of an array) for `$NAME`, `${NAME}`, `${NAME[@]}`."""
        if node.type == "simple_expansion":
            names = [c for c in node.children if c.type == "variable_name"]
            return (names[0].text.decode() if names and names[0].text else None), False
        if node.type == "expansion":
            inner = [c for c in node.children if c.type not in ("${", "}")]
            if len(inner) == 1 and inner[0].type == "variable_name" and inner[0].text:
                return inner[0].text.decode(), False
            if len(inner) == 1 and inner[0].type == "subscript":
                parts = inner[0].children
                if len(parts) == 4 and parts[0].type == "variable_name" and \
                        parts[2].text in (b"@", b"*") and parts[0].text:
                    return parts[0].text.decode(), True
        return None, False

    def _reference(self, node: Node) -> tuple[str | None, bool]:
        """A word that is a whole variable bash splits into words: `$NAME` (a string split at
        spaces) or `${NAME[@]}` / `"${NAME[@]}"` (an array's elements)."""
        if node.type == "string":
            inner = [c for c in node.children if c.type != '"']
            if len(inner) == 1:
                name, array = self._variable(inner[0])
                return (name, True) if array else (None, False)
            return None, False
        return self._variable(node)

    def follow(self, name: str, *, array: bool, command: bool = False) -> list[Token] | None:
        """The tokens of variable `name`'s value, or None where it is not known for sure: set
        more than once (bar appends: `+=`, `NAME=( "${NAME[@]}" ... )`), inside a block (bar
        an append the reader left out), after the launch, or nested too deep. `command`: the
        string is a whole command (`sh -c "$CMD"`), followed even where it holds no flag."""
        assigned = self.assignments.get(name, [])
        if not assigned or name in self.following or len(self.following) >= _MAX_FOLLOW:
            return None
        kept = []
        for node in assigned:
            if node.start_byte > self.launch.start_byte:
                return None
            if context_of(node) is not None:
                if (name, node.start_point[0] + 1) in self.left_out:
                    continue  # read without it: the block's flags are none autotune edits
                return None
            decl = node.parent
            if decl is not None and decl.type == "declaration_command" and \
                    decl.children and decl.children[0].type == "local":
                return None
            kept.append(node)
        assigned = kept
        if not assigned:
            return None
        given = [a.child_by_field_name("value") for a in assigned]
        values = [v for v in given if v is not None]
        appends = [self._appends(a) for a in assigned]
        if len(values) < len(given) or (appends[0] and values[0].type != "array"):
            return None
        # `NAME+=( ... )` first (the tutorials' MODEL_PARALLEL_ARGS): bash makes the array
        # of its words, as autotune's reader does.
        is_array = [v.type == "array" for v in values]
        if len(assigned) > 1 and any(a != is_array[0] for a in is_array):
            return None
        if not array and not is_array[0] and not command and \
                not re.search(r"(^|\s)--", self.script.raw(values[0]).strip("'\"")):
            # A string that holds no flag (`TP=2`): a value, replaced where the launch
            # uses it, not in the assignment other commands may read.
            return None
        if is_array[0] != array:
            return None  # `$ARRAY` is its first element, `"${STRING[@]}"` one word
        # Each later assignment appends: `NAME+=( ... )`, `NAME=( "${NAME[@]}" ... )` (its
        # first element, the array so far, is skipped), or `NAME+=" --flag"` onto a string
        # (joined without a space by bash: only where a blank keeps the words apart).
        elements: list[list[Node]] = []
        for k, value in enumerate(values):
            if value.type != "array":
                if k and not (appends[k] and re.match(r"""['"]?[ \t\n]""",
                                                      self.script.raw(value))):
                    return None
                elements.append([value])
                continue
            items = [e for e in value.named_children if e.type != "comment"]
            if k and not appends[k]:
                if not items or self._reference(items[0]) != (name, True):
                    return None
                items = items[1:]
            elements.append(items)
        self.following.append(name)
        try:
            out: list[Token] = []
            for items in elements:
                for element in items:
                    if is_array[0]:
                        out += self.word(element)
                        continue
                    split = self.split(element)
                    if split is None:
                        return None
                    out += split
            return out
        finally:
            self.following.pop()

    def _appends(self, assignment: Node) -> bool:
        """`NAME+=...` (not `NAME=...`)."""
        name = assignment.child_by_field_name("name")
        end = assignment.start_byte if name is None else name.end_byte
        return self.script.data[end:end + 2] == b"+="

    def split(self, value: Node) -> list[Token] | None:
        """A string variable's value split at spaces, as bash splits an unquoted `$NAME` (and
        eval reads it again); None where quotes or escapes inside it would make eval read it
        otherwise."""
        raw = self.script.raw(value)
        if value.type in ("word", "number"):
            text = _literal(self.script, value)
            return None if text is None or text != raw else \
                [Token(text, text, value.start_byte, value.end_byte, "")]
        if value.type == "raw_string":
            return self._split_text(raw[1:-1], value.start_byte + 1, "'")
        if value.type != "string":
            return None
        tokens: list[Token] = []
        pieces: list[tuple[int, int, str | None]] = []  # one word being built

        def flush() -> None:
            if pieces:
                texts = [p[2] for p in pieces]
                text = None if any(t is None for t in texts) else "".join(t or "" for t in texts)
                head = ""
                for t in texts:
                    if t is None:
                        break
                    head += t
                tokens.append(Token(text, head, pieces[0][0], pieces[-1][1], '"'))
                pieces.clear()

        # The string's parts in order: text (string_content nodes, and the blanks the
        # grammar leaves between two expansions, which are no node) and expansions.
        segments: list[tuple[int, int, Node | None]] = []
        at = value.start_byte + 1
        for child in value.children:
            if child.type == '"':
                if child.start_byte > at:
                    segments.append((at, child.start_byte, None))
                at = max(at, child.end_byte)
                continue
            begin = child.start_byte
            if child.type != "string_content":
                # tree-sitter-bash starts an expansion's node at the blanks before it.
                blank = re.match(rb"(?:[ \t\n]|\\\n)*", self.script.data[begin:child.end_byte])
                begin += blank.end() if blank else 0
            if begin > at:
                segments.append((at, begin, None))
            segments.append((begin, child.end_byte,
                             None if child.type == "string_content" else child))
            at = child.end_byte
        data = self.script.data
        for k, (begin, finish, part) in enumerate(segments):
            if part is None:
                # A line continuation beside a blank splits as a blank (bash drops it from
                # a double-quoted string; the new shell or eval reads it as one); the same
                # length, so that the offsets stay the file's.
                content = _CONTINUATION.sub("  ", data[begin:finish].decode("utf-8"))
                if re.search(r"[\\'\"`]", _DEFERRED.sub("", content)):
                    return None
                for m in re.finditer(r"[^ \t\n]+|[ \t\n]+", content):
                    if m.group(0)[0] in " \t\n":
                        flush()
                        continue
                    start = begin + len(content[:m.start()].encode())
                    # `\${NAME:-1}`: the new shell's to expand, a word autotune does not
                    # know (kept where it stands, replaced where it is a value the export
                    # changes, as `$TP` is; the read-back check holds either way).
                    pieces.append((start, start + len(m.group(0).encode()),
                                   None if "\\$" in m.group(0) else m.group(0)))
            else:
                name, array = self._variable(part)
                nxt = segments[k + 1] if k + 1 < len(segments) else None
                alone = not pieces and (nxt is None or (nxt[2] is None and _CONTINUATION.sub(
                    "  ", data[nxt[0]:nxt[1]].decode("utf-8"))[:1] in (" ", "\t", "\n")))
                followed = self.follow(name, array=array) if name is not None and alone \
                    else None
                if followed is not None:
                    tokens.extend(followed)
                else:
                    pieces.append((begin, finish, None))
        flush()
        return tokens

    def _split_text(self, text: str, offset: int, quoting: str) -> list[Token]:
        out = []
        for m in re.finditer(r"[^ \t\n]+", _CONTINUATION.sub("  ", text)):
            start = offset + len(text[:m.start()].encode())
            out.append(Token(m.group(0), m.group(0), start, start + len(m.group(0).encode()),
                             quoting))
        return out


_OPERATOR = re.compile(r"\d*[;&|<>]")
"""A word of a `sh -c` string that ends its command (`&&`, `;`, `|`, `2>&1`, `> log`)."""


@dataclass(frozen=True, slots=True)
class _Launch:
    """The launch command's words after the training script (`tokens`); for `[srun ...] sh -c
    STRING`, those of the string's command, with `inner` set: flags then go after its last
    word, inside the string (`why`: the string is written in a way autotune does not patch)."""

    tokens: list[Token]
    inner: bool = False
    why: str | None = None


def _words(launch: Node) -> list[Node]:
    out: list[Node] = []
    for child in launch.children:
        if child.type in _REDIRECTS or child.type in ("variable_assignment", "comment"):
            continue
        out += child.children if child.type == "command_name" else [child]
    return out


def _shell_string(script: Script, words: list[Node]) -> Node | None:
    """The STRING of `[srun ...] sh -c STRING` (shell_script.shell_c_at reads the shape)."""
    at = shell_c_at([(_literal(script, n), script.raw(n).strip("'\"")) for n in words])
    return None if at is None else words[at[1]]


def _string_tokens(follower: _Follower, node: Node) -> list[Token] | str:
    """The words of a `sh -c` string as the new shell splits them, or why autotune does not
    patch it: a quote or backslash inside it (the new shell would lex them again)."""
    script = follower.script
    if node.type == "string":
        inner = [c for c in node.children if c.type != '"']
        if len(inner) == 1 and inner[0].type != "string_content":
            name, array = follower._variable(inner[0])
            followed = None if name is None or array else follower.follow(name, array=False,
                                                                        command=True)
            if followed is not None:
                return followed
            return (f"{script.raw(node)} comes from a variable autotune does not follow (set "
                    "in a block, more than once, or by the environment)")
        split = follower.split(node)
        if split is not None:
            return split
    elif node.type == "raw_string":
        text = script.raw(node)[1:-1]
        if not re.search(r"[\\\"`]", _CONTINUATION.sub("  ", text)):
            # Single quotes: the new shell expands `$NAME` (one the script exported).
            return [Token(t.text if "$" not in (t.text or "") else None,
                          (t.text or "").split("$")[0], t.start, t.end, "'")
                    for t in follower._split_text(text, node.start_byte + 1, "'")]
    return ("holds quotes or backslashes, which its shell lexes again: autotune does not "
            "patch such a string")


def _refuse_job_script(command: MegatronCommand, what: str) -> None:
    """One line where the launch is in the job script of `sbatch <<EOF`: its text is data of
    the script (expanded by it before sbatch reads it where the delimiter is unquoted), so an
    edit there is not an edit of a command autotune's parser sees; the plan stands."""
    if command.site.node is None:
        raise ConfigError(f"{command.source}: line {command.line}: the launch is in the "
                          "here-document fed to sbatch, which autotune reads but does not "
                          f"edit; change it by hand: {what}")


def _launch(command: MegatronCommand) -> _Launch:
    script, launch = command.parsed, command.site.node
    _refuse_job_script(command, "the flags the export names")
    assert launch is not None
    left_out = frozenset((m.name, m.line) for m in command.maybe)
    follower = _Follower(script, launch, left_out)
    words = _words(launch)
    string = _shell_string(script, words)
    inner = string is not None
    tokens: list[Token] = []
    if string is not None:
        found = _string_tokens(follower, string)
        if isinstance(found, str):
            return _Launch([], True, f"line {command.line}: the sh -c string {found}")
        tokens = found
    else:
        evaluated = bool(words) and _literal(script, words[0]) == "eval"
        for node in words:
            tokens += follower.word(node, command=evaluated)
    at = next((k for k, t in enumerate(tokens) if script.data[t.start:t.end].decode()
               .strip("'\"").endswith(TRAINING_SCRIPT)), None)
    if at is None:
        if inner:
            return _Launch([], True, f"line {command.line}: the sh -c string's "
                                     f"{TRAINING_SCRIPT} comes from a variable autotune does "
                                     "not follow")
        return _Launch(tokens)
    tokens = tokens[at + 1:]
    if inner:
        # The string may run more than the launch (`... 2>&1 | tee log`, `&& echo done`).
        end = next((k for k, t in enumerate(tokens) if _OPERATOR.match(t.head)), len(tokens))
        tokens = tokens[:end]
    return _Launch(tokens, inner)


def launch_tokens(command: MegatronCommand) -> list[Token]:
    """The launch command's words after the training script, as bash splits them, each with
    its place in the file (the launcher's options when the script is not found among them;
    for `sh -c STRING`, the string's launch)."""
    return _launch(command).tokens


# ---- edits ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int
    end: int
    text: str


def _occurrences(tokens: list[Token], flag: Flag) -> list[tuple[int, list[int]]]:
    """(the flag's token, its value tokens) for each place the command gives `flag`; an inline
    `--flag=value` has no value tokens."""
    out = []
    for k, token in enumerate(tokens):
        if token.text == flag.name:
            values: list[int] = []
            if flag.takes_value:
                j = k + 1
                while j < len(tokens) and not tokens[j].head.startswith("--") and (
                        flag.many or not values):
                    values.append(j)
                    j += 1
            out.append((k, values))
        elif token.head.startswith(flag.name + "="):
            out.append((k, []))
    return out


def _shown(value: str, token: Token, source: str, name: str) -> str:
    if token.quoting == "" and not _PLAIN.fullmatch(value):
        return shlex.quote(value)
    if not _PLAIN.fullmatch(value):
        raise ConfigError(f"{source}: {name} {value!r} would go inside a quoted string of "
                          "the script; change it by hand")
    return value


def _removal(data: bytes, tokens: list[Token], first: int, last: int) -> _Edit:
    """Take out tokens[first..last] with the blank (or line continuation) before them, unless
    a comment stands there; then the blank after them."""
    start, end = tokens[first].start, tokens[last].end
    before = tokens[first - 1].end if first > 0 and tokens[first - 1].end <= start else None
    if before is not None and b"#" not in data[before:start] and \
            data[before:start].strip(b" \t\\\n") == b"":
        return _Edit(before, end, "")
    line_start = data.rfind(b"\n", 0, start) + 1
    line_end = data.find(b"\n", end)
    line_end = len(data) if line_end < 0 else line_end
    if not data[line_start:start].strip() and not data[end:line_end].strip():
        return _Edit(line_start, min(line_end + 1, len(data)), "")  # a line of its own
    m = re.match(rb"[ \t]*(\\\n[ \t]*)?", data[end:])
    return _Edit(start, end + (m.end() if m else 0), "")


def _before_passed_on(script: Script, tokens: list[Token], rows: list[list[str]]
                      ) -> _Edit | None:
    """New flags before the script's own arguments where they end the launch, written in an
    array it expands (`ARGS=( ... "$@" )`) or in the command: after them, a flag given when
    the script runs would no longer override autotune's, as it overrode the user's own."""
    def passed_on(token: Token) -> bool:
        written = script.data[token.start:token.end].decode("utf-8")
        return token.text is None and SCRIPT_ARGUMENTS.fullmatch(written) is not None

    if not tokens or not passed_on(tokens[-1]):
        return None
    k = len(tokens) - 1
    while k > 0 and passed_on(tokens[k - 1]):
        k -= 1
    at = tokens[k].start
    return _Edit(at, at, " ".join(shlex.quote(a) for row in rows for a in row) + " ")


def _insertion(script: Script, launch: Node, rows: list[list[str]]) -> _Edit:
    """New flags onto the launch command, in the command's own layout: where it spans lines,
    each row's flags on a continued line of their own before its last line (which stays as
    the user wrote it); else after its last argument."""
    words = [c for c in launch.children
             if c.type not in _REDIRECTS and c.type not in ("variable_assignment", "comment")]
    last = words[-1]
    texts = [" ".join(shlex.quote(a) for a in args) for args in rows]
    if launch.start_point[0] == last.start_point[0]:
        return _Edit(last.end_byte, last.end_byte, " " + " ".join(texts))
    first = next(w for w in words if w.start_point[0] == last.start_point[0])
    line_start = script.data.rfind(b"\n", 0, first.start_byte) + 1
    indent = script.data[line_start:first.start_byte]
    if first is words[0] or indent.strip(b" \t"):
        return _Edit(last.end_byte, last.end_byte, "".join(f" \\\n    {t}" for t in texts))
    pad = indent.decode()
    return _Edit(first.start_byte, first.start_byte,
                 "".join(f"{t} \\\n{pad}" for t in texts))


def _export(command: MegatronCommand, change: RowChange) -> _Edit:
    """`export NAME=value` on a line of its own before the launch command, at its indent: the
    run's environment as the new layout needs it (autotune.megatron.environment). The value
    is the script's own followed by the new option, quoted: nothing in it is run."""
    name = change.variable
    assert name is not None and command.site.node is not None
    if any(n == name for n, _ in command.env):
        raise ConfigError(f"{command.source}: line {command.line}: the launch command sets "
                          f"{name} itself; change it by hand: {change.describe()}")
    launch = command.site.node
    data = command.parsed.data
    line_start = data.rfind(b"\n", 0, launch.start_byte) + 1
    lead = data[line_start:launch.start_byte]
    indent = lead[:len(lead) - len(lead.lstrip(b" \t"))].decode()
    return _Edit(line_start, line_start,
                 f"{indent}export {name}={shlex.quote(change.after[0])}\n")


def _current_values(command: MegatronCommand) -> dict[str, str]:
    """Each flag's value as the evaluator read it (the last occurrence, as argparse takes it)."""
    out: dict[str, str] = {}
    for group in command.groups:
        if group.flag is None:
            continue
        _name, eq, inline = (group.words[0].text or "").partition("=")
        words = group.words[1:]
        out[group.flag] = inline if eq else " ".join(w.text or "\0" for w in words)
    return out


@dataclass(frozen=True, slots=True)
class Respelling:
    """A flag of the user's command spelled otherwise for a megatron-core release."""

    old: str
    new: str | None
    """None: the release removed it (a no-op there), and it goes with its value."""
    token: int
    """Its place among launch_tokens(command)."""

    def describe(self) -> str:
        return f"{self.old} -> {self.new}" if self.new else f"{self.old} (removed)"


def _flag_name(token: Token) -> str | None:
    """The flag a token gives (`--name` of `--name` or `--name=value`), or None."""
    text = token.text if token.text is not None else token.head
    if not text.startswith("--") or (token.text is None and "=" not in text):
        return None  # a value, or a flag whose name is partly an expansion
    return text.partition("=")[0]


def respellings(command: MegatronCommand, version: MegatronVersion) -> list[Respelling]:
    """The flags of the launch command that `version` spells otherwise, in order; a flag the
    release lacks (or that merged several of the command's release) is refused in one line
    (ConfigError), as is one that needs respelling in a variable autotune does not follow."""
    tokens = launch_tokens(command)
    out: list[Respelling] = []
    seen: set[str] = set()
    for k, token in enumerate(tokens):
        name = _flag_name(token)
        if name is None:
            continue
        seen.add(name)
        spelled = spell_args([name], version)
        if spelled != [name]:
            out.append(Respelling(name, spelled[0] if spelled else None, k))
    hidden = {g.flag for g in command.groups if g.flag is not None} - seen
    for name in sorted(hidden):
        if spell_args([name], version) != [name]:
            raise ConfigError(f"{command.source}: line {command.line}: {name} comes from a "
                              "variable autotune does not follow; megatron-core "
                              f"{version.version} spells it {_spelled(name, version)}: change "
                              "it by hand")
    return out


def _spelled(name: str, version: MegatronVersion) -> str:
    spelled = spell_args([name], version)
    return spelled[0] if spelled else "nothing (removed)"


def _respelling_edits(command: MegatronCommand, tokens: list[Token],
                      found: list[Respelling]) -> list[_Edit]:
    data, source = command.parsed.data, command.source
    edits = []
    for r in found:
        token = tokens[r.token]
        if r.new is None:
            # Its value goes too, where it has one as a word of its own (spell_args' rule).
            last = r.token
            if token.text is not None and "=" not in token.text and r.token + 1 < len(tokens) \
                    and _flag_name(tokens[r.token + 1]) is None \
                    and not tokens[r.token + 1].head.startswith("--"):
                last = r.token + 1
            edits.append(_removal(data, tokens, r.token, last))
        elif data[token.start:token.end].startswith(r.old.encode()):
            # The name as written, bare: only it changes (`--old=$VALUE` keeps its value).
            edits.append(_Edit(token.start, token.start + len(r.old.encode()), r.new))
        elif token.text is not None:
            shown = _shown(r.new + token.text[len(r.old):], token, source, r.old)
            edits.append(_Edit(token.start, token.end, shown))
        else:
            raise ConfigError(f"{source}: line {command.line}: {r.old} is written in a way "
                              f"autotune cannot respell; write {r.new} for it by hand")
    return edits


def patch_script(command: MegatronCommand, new_layout: Layout,
                 changes: list[RowChange], megatron_version: MegatronVersion | None = None
                 ) -> str:
    """The user's file with the flags of `changes`
    (autotune.megatron.megatron_command.layout_changes from the command's layout to `new_layout`)
    edited on its launch command (module docstring) and, with `megatron_version`, its other flags
    spelled for that release (`respellings`); every other byte as it was."""
    script, launch, source = command.parsed, command.site.node, command.source
    if launch is None and not changes and megatron_version is None:
        return script.text  # nothing to edit: the file as it is
    _refuse_job_script(command, "; ".join(c.describe() for c in changes)
                       or f"respell its flags for megatron-core "
                       f"{megatron_version.version if megatron_version else ''}")
    assert launch is not None
    launched = _launch(command)
    tokens = launched.tokens
    present = {g.flag for g in command.groups if g.flag is not None}
    current = _current_values(command)
    new = exported_layout(new_layout)
    rows = {row.name: row for row in FLAG_TABLE}
    edits: list[_Edit] = [_export(command, c) for c in changes if c.variable is not None]
    added: list[list[str]] = []  # per row
    for change in changes:
        if change.variable is not None:
            continue
        row = rows[change.row]
        # The layout string's new value is the change's own (the user's style kept:
        # megatron_command.layout_changes); autotune's own commands never write one.
        wanted = flag_values(change.after) if change.row == PIPELINE_LAYOUT else \
            flag_values(row_args(row, command.model, new))
        added.append([])
        for flag in row.flags:
            places = _occurrences(tokens, flag)
            if flag.name in present and not places and launched.why is not None:
                raise ConfigError(f"{source}: {launched.why}; change it by hand: "
                                  f"{change.describe()}")
            if flag.name in present and not places:
                raise ConfigError(
                    f"{source}: line {command.line}: {flag.name} comes from a variable autotune "
                    "does not follow (set in a block, more than once, by the environment or a "
                    "command); write it in the launch command or an array set once, or change "
                    f"it by hand: {change.describe()}")
            if flag.name not in wanted:
                for k, values in places:
                    edits.append(_removal(script.data, tokens, k, values[-1] if values else k))
                continue
            value = " ".join(wanted[flag.name])
            if not places:
                added[-1] += [flag.name, *wanted[flag.name]]
                continue
            if not flag.takes_value or current.get(flag.name) == value:
                continue
            for k, values in places:
                token = tokens[k]
                if not values:  # --flag=value in one word
                    edits.append(_Edit(token.start, token.end,
                                       _shown(f"{flag.name}={value}", token, source,
                                              flag.name)))
                    continue
                first, last = tokens[values[0]], tokens[values[-1]]
                shown = " ".join(_shown(v, first, source, flag.name)
                                 for v in wanted[flag.name])
                edits.append(_Edit(first.start, last.end, shown))
    if megatron_version is not None:
        edits += _respelling_edits(command, tokens, respellings(command, megatron_version))
        added = [spell_args(a, megatron_version) for a in added]
    if any(added) and launched.inner:
        edits.append(_inner_insertion(command, launched, [a for a in added if a]))
    elif any(added):
        flags = [a for a in added if a]
        edits.append(_before_passed_on(script, tokens, flags)
                     or _insertion(script, launch, flags))
    patched = _apply(script, edits)
    _check_read_back(command, patched, new_layout, changes, edits)
    return patched


def _check_read_back(command: MegatronCommand, patched: str, new_layout: Layout,
                     changes: list[RowChange], edits: list[_Edit]) -> None:
    """The patched script read again as autotune reads the user's (the same launch line,
    moved by the edits above it): its layout must be the one exported and its model the
    user's. The reader and the patch see the script through two parsers (shell_script's
    evaluator, tree-sitter's tree); where an edit landed elsewhere than the reader takes the
    flag from (a `sh -c` string, an array grown by appends), the export is refused in one line
    rather than written wrong."""
    launch = command.site.node
    assert launch is not None
    before = [e for e in set(edits) if e.end <= launch.start_byte]
    moved = sum(e.text.count("\n") - command.parsed.data[e.start:e.end].count(b"\n")
                for e in before)
    line = command.site.line + moved
    changed = "; ".join(c.describe() for c in changes)
    try:
        again = read_megatron_command(command.source, line, patched.encode())
        got: Layout | None = megatron_layout(again, new_layout.world_size)
    except ConfigError as exc:
        raise ConfigError(f"{command.source}: line {command.line}: the patched script does not "
                          f"read back ({exc}); change the flags by hand: {changed}") from None
    want = exported_layout(new_layout)
    if command.layout_string is not None:
        # Kept as a layout string, the split reads back as the string says it: at vpp 1 the
        # embedding/loss split as the end stages' own counts, the same layers.
        want = string_split(command.model, want, command.source)
    # The same run is enough: a layout's fields that Megatron ignores (the recompute modules
    # without selective recompute, which the search's layout may still carry from the user's)
    # are not written, so they read back as their defaults (autotune.megatron.identity).
    if got is not None and got != want and run_key(command.model, got) == run_key(
            command.model, want):
        got = want
    if got != want or again.model != command.model:
        what = "another model" if again.model != command.model else \
            f"{got.describe() if got else '?'}, not {want.describe()}"
        raise ConfigError(f"{command.source}: line {command.line}: the patched script would "
                          f"read back as {what}: autotune did not find every place its flags "
                          f"come from; change them by hand: {changed}")


def _inner_insertion(command: MegatronCommand, launched: _Launch,
                     rows: list[list[str]]) -> _Edit:
    """New flags inside a `sh -c` string (or the variable that holds it), after its launch's
    last word: written after the string, they would be the new shell's $0, not flags."""
    where = f"{command.source}: line {command.line}"
    if launched.why is not None:
        raise ConfigError(f"{command.source}: {launched.why}; add by hand: "
                          + " ".join(a for args in rows for a in args))
    if not launched.tokens:
        raise ConfigError(f"{where}: the sh -c string's {TRAINING_SCRIPT} has no flags "
                          "autotune can add after; add by hand: "
                          + " ".join(a for args in rows for a in args))
    args = [a for row in rows for a in row]
    odd = [a for a in args if not _PLAIN.fullmatch(a)]
    if odd:
        raise ConfigError(f"{where}: {odd[0]!r} would go inside the sh -c string; add "
                          f"{' '.join(args)} by hand")
    last = launched.tokens[-1]
    return _Edit(last.end, last.end, " " + " ".join(args))


def _apply(script: Script, edits: list[_Edit]) -> str:
    data = script.data
    # One place can be reached twice (an array the command expands twice): one edit.
    ordered = sorted(set(edits), key=lambda e: (e.start, e.end, e.text))
    for a, b in itertools.pairwise(ordered):
        if b.start < a.end:
            raise ConfigError(f"{script.source}: two flag edits overlap at byte {b.start}; "
                              "change the flags by hand")
    for edit in reversed(ordered):
        data = data[:edit.start] + edit.text.encode() + data[edit.end:]
    return data.decode("utf-8")
