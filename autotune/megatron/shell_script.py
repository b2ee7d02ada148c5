"""A shell script read, never run: its simple commands as words, with the variables it assigns.

autotune reads a user's Megatron-LM launch script (autotune.megatron.megatron_command) without
executing any of it: this module lexes bash's quoting (single and double quotes, backslashes, line
continuations, comments), follows simple assignments in order (`NAME=value`, `export`,
`declare`, arrays `NAME=( ... )` and `NAME+=( ... )`, `eval` of a string it could expand) and
expands `$NAME`, `${NAME}`, `${NAME:-default}` and `${NAME[@]}` with bash's word splitting.
`[srun ...] sh -c STRING` (bash, sh) is read as the string's commands, lexed as the new shell
lexes them, with the variables the script exported (Command.wrapper keeps `srun ...`); so is the
job script of `sbatch <<EOF` (a here-document the caller hands over: HereDoc; also of
`JOBID=$(sbatch --parsable <<EOF ...)`, the substitution never run), expanded first by
this script where its delimiter is unquoted, as bash does (Command.job keeps what sbatch gets).
An `if` whose condition compares strings the script sets (`[[ "$DTYPE" == "fp8" ]]`, `[ -z
"$X" ]`, `test`, joined by `&&` / `||`; Megatron-LM's own examples choose their FP8 and data
flags so) is decided by comparing them, never by running anything: the branch that runs is
read as plain statements, the others are not. What it cannot know without running something
(`$(...)`, backticks, arithmetic, a command's status, a glob in `[[ ]]`, a variable set only
inside a loop, a case, a function or an if it cannot decide, one the environment provides)
stays a `Ref` in the word, with the reason, so that the caller can refuse it where it matters
and carry it (as `"${NAME}"`) where it does not.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import ConfigError

__all__ = ["Command", "HereDoc", "JobScript", "Ref", "Word", "read_commands",
           "read_script_commands", "shell_c_at", "shell_string"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_OPERATORS = ";&|<>()\n"
_REDIRECT = re.compile(r"\d*(>>|>&|<&|&>>|&>|>|<<<|<<|<)(?!\()((?<=&)(?:\d+|-))?")
_BLOCK_OPEN = {"if", "for", "while", "until", "case", "select", "function"}
_BLOCK_CLOSE = {"fi", "done", "esac", "}"}
_BLOCK_MIDDLE = {"then", "do", "else", "elif", "{", "!", "time"}
_DECLARE = {"export", "declare", "typeset", "local", "readonly"}
_PLAIN_DEFAULT = re.compile(r"[A-Za-z0-9_.,:/+@%-]*")
"""A default that reads the same written inside `${NAME:-...}` for a new shell to expand."""
_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "zsh"})
"""Shells whose `-c STRING` runs the string as a script (`srun ... sh -c "${CMD}"`)."""
_SHELL_C = re.compile(r"-[A-Za-z]*c[A-Za-z]*")
"""A short-option cluster holding -c (`-c`, `-lc`, `-ec`)."""
SCRIPT_ARGUMENTS = re.compile(r'"?\$(?:[@*]|\{[@*]\})"?')
"""A word that is the script's own arguments alone, as the script writes it (`"$@"`, `$*`) or as
a Ref shows it (`${@}`): what the command passes on from how the script is called."""

MAX_EXPANDED_CHARS = 4 * 2**20
"""Characters all expansions of one script may produce: a launch command is a few KiB, and a
variable doubled again and again (`A=$A$A`) reaches this in about 22 steps instead of 6 GB."""
_WORD_COST = 64
"""What one word counts for against MAX_EXPANDED_CHARS: an array of empty words doubled again
and again costs Python objects, not characters."""
MAX_DEFAULT_DEPTH = 50
"""`${A:-${B:-...}}` inside one another: each level is a Python frame or three."""
READ_SECONDS = 5.0
"""The most the evaluator may take on one script (it takes milliseconds on a launch script)."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A part of a word the static reading cannot resolve: `text` as the script wrote it,
    `name` the variable (None for a command substitution or arithmetic), `reason` why, `line`
    the script's line that wrote it: a `$((...))` set in a variable is mended where it was
    written, not where the variable is used (None: not written in the script)."""

    text: str
    name: str | None
    reason: str
    line: int | None = None

    @property
    def arithmetic(self) -> bool:
        """`$((...))`: never evaluated (not even integer literals: what a user typed is never
        run by autotune, nor by a script it writes), refused where autotune needs the value
        and carried as written where it does not."""
        return self.text.startswith("$((")

    @property
    def plain(self) -> bool:
        """A variable the environment may provide, safe to carry as "${NAME}"."""
        return self.name is not None and _NAME.fullmatch(self.name) is not None


@dataclass(frozen=True, slots=True)
class Word:
    """One word after expansion: literal text and unresolved references, in order."""

    parts: tuple[str | Ref, ...]
    env_defaults: frozenset[str] = field(default=frozenset(), compare=False)
    """Variables the script never sets whose `${NAME:-word}` default gave part of the word:
    the environment's when the script runs (torchrun's `--nnodes ${SLURM_NNODES:-1}`)."""

    @property
    def text(self) -> str | None:
        """The word's text when every part resolved, else None."""
        if any(isinstance(p, Ref) for p in self.parts):
            return None
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def refs(self) -> tuple[Ref, ...]:
        return tuple(p for p in self.parts if isinstance(p, Ref))

    def shown(self) -> str:
        """The word as the script wrote its unresolved parts (for messages)."""
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    @classmethod
    def of(cls, text: str) -> Word:
        return cls((text,))


@dataclass(frozen=True, slots=True)
class Command:
    """A simple command: its words, the `NAME=value` prefixes it runs with, the variables the
    script had exported by then, and the line it starts on."""

    words: tuple[Word, ...]
    env: tuple[tuple[str, Word], ...]
    exported: tuple[tuple[str, Word], ...]
    line: int
    maybe: tuple[Maybe, ...] = ()
    """Words an array the command expands may also hold: appended inside a block whose
    condition autotune does not run, and left out (read_commands' `optional`)."""
    wrapper: tuple[Word, ...] = ()
    """The words of the command whose `sh -c STRING` / `bash -c STRING` ran this one, up to the
    shell (`srun -l --container-image IMG`): `words` are the string's command."""
    job: JobScript | None = None
    """The `sbatch <<EOF` job script this command is in (None: the script's own command)."""
    in_block: bool = False
    """Inside an if/for/case block or a function (only a job script's commands need this: the
    caller's syntax tree says it for the file's own)."""


@dataclass(frozen=True, slots=True)
class HereDoc:
    """The text of a here-document fed to `sbatch` (`sbatch <<EOF ... EOF`): a job script."""

    text: str
    """As written, each line's leading tabs removed for `<<-`."""
    line: int
    """The file's line of its first line."""
    expands: bool
    """An unquoted delimiter (`<<EOF`, not `<<'EOF'`): this script expands `$...` in it
    before sbatch reads it."""


@dataclass(frozen=True, slots=True)
class JobScript:
    """A job script as sbatch gets it: its text (expanded where its here-document's delimiter
    is unquoted; for its `#SBATCH` lines) and sbatch's own words (their options override those
    lines)."""

    text: str
    sbatch: tuple[Word, ...]
    submit_defaults: frozenset[str] = frozenset()
    """Variables the script never sets whose `${NAME:-word}` this script expanded into the
    text (an unquoted delimiter): the environment's when the job is submitted, not when it
    runs (`${SLURM_NNODES:-1}` is 1 on a login node)."""


@dataclass(frozen=True, slots=True)
class Maybe:
    """Words appended to an array inside an if/for/case block or a function, which autotune
    reads the array without."""

    name: str
    line: int
    words: tuple[Word, ...]


# ---- lexing --------------------------------------------------------------------------------
# A raw word is a list of segments: ("lit", text, quoted) | ("var", spec, quoted)
# | ("sub", text, line) for $(...), `...` and $((...)), `line` the lexed text's line it starts
# on | ("array", [raw words]).


_Seg = tuple[Any, ...]


@dataclass(slots=True)
class _Statement:
    words: list[list[_Seg]] = field(default_factory=list)
    line: int = 1
    joined: str = ""
    """The operator characters between the statement before and this one (`||`, `&&`, `;`,
    a newline): how a condition's commands combine (_Reader.decide)."""


class _Lexer:
    def __init__(self, text: str, source: str) -> None:
        self.s = text
        self.i = 0
        self.source = source
        # Offsets of the newlines: a statement's line by bisection, not by counting from the
        # start (quadratic in a file of many short statements).
        self.newlines = [k for k, c in enumerate(text) if c == "\n"]

    def line_at(self, offset: int) -> int:
        return bisect.bisect_left(self.newlines, offset) + 1

    def error(self, what: str) -> ConfigError:
        line = self.line_at(self.i)
        return ConfigError(f"{self.source}: line {line}: {what}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def statements(self) -> list[_Statement]:
        out: list[_Statement] = []
        current = _Statement(line=1)
        skip_target = False
        pending = ""  # operator characters since the last statement
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif (redirect := _REDIRECT.match(self.s, self.i)) is not None:
                # `> log`, `2>&1`, `<<EOF`: not arguments of the command; the file after the
                # operator is skipped too unless the operator holds it (`2>&1`).
                self.i = redirect.end()
                skip_target = not redirect.group(2)
            elif c in _OPERATORS:
                self.i += 1
                pending += c
                if current.words:
                    out.append(current)
                current = _Statement(line=self.line_at(self.i))
            else:
                if not current.words:
                    current.line = self.line_at(self.i)
                    current.joined, pending = pending, ""
                word = self.word()
                if skip_target:  # a redirection's file: not an argument of the command
                    skip_target = False
                else:
                    current.words.append(word)
        if current.words:
            out.append(current)
        return out

    def word(self) -> list[_Seg]:
        segs: list[_Seg] = []
        start = self.i
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t\r" or c in _OPERATORS:
                if c == "(" and segs and self._assignment_prefix(start):
                    self.i += 1
                    segs.append(("array", self._array()))
                    continue
                break
            if c == "\\":
                nxt = self.peek(1)
                self.i += 2
                if nxt != "\n":
                    segs.append(("lit", nxt, True))
            elif c == "'":
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("a single quote is not closed")
                segs.append(("lit", self.s[self.i + 1:end], True))
                self.i = end + 1
            elif c == '"':
                self.i += 1
                segs += self._double_quoted()
            elif c == "$":
                segs.append(self._dollar(quoted=False))
            elif c == "`":
                end = self.s.find("`", self.i + 1)
                if end < 0:
                    raise self.error("a backtick is not closed")
                segs.append(("sub", self.s[self.i:end + 1], self.line_at(self.i)))
                self.i = end + 1
            else:
                segs.append(("lit", c, False))
                self.i += 1
        return segs

    def heredoc(self) -> list[_Seg]:
        """The rest of the text as an unquoted here-document's: `$...` and backticks expand,
        a backslash escapes only `$`, `` ` ``, `\\` and a newline (which it removes), quotes
        are text (bash's "Here Documents")."""
        return self._expanding("$`\\\n", closing=None)

    def _assignment_prefix(self, start: int) -> bool:
        return _ASSIGN.fullmatch(self.s[start:self.i]) is not None

    def _array(self) -> list[list[_Seg]]:
        words: list[list[_Seg]] = []
        while True:
            if self.i >= len(self.s):
                raise self.error("an array ( ... ) is not closed")
            c = self.peek()
            if c in " \t\r\n":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif c == ")":
                self.i += 1
                return words
            else:
                words.append(self.word())

    def _double_quoted(self) -> list[_Seg]:
        return self._expanding('$`"\\\n', closing='"')

    def _expanding(self, escapes: str, *, closing: str | None) -> list[_Seg]:
        """Text in which `$...` and backticks expand and a backslash escapes only `escapes`
        (an escaped newline is removed), up to `closing` (consumed; a double quote) or, for
        None, the end of the text (a here-document's body)."""
        segs: list[_Seg] = [("lit", "", True)]  # "" is a word even when empty
        while True:
            if self.i >= len(self.s):
                if closing is None:
                    return segs
                raise self.error("a double quote is not closed")
            c = self.peek()
            if c == closing:
                self.i += 1
                return segs
            if c == "\\" and self.peek(1) and self.peek(1) in escapes:
                if self.peek(1) != "\n":
                    segs.append(("lit", self.peek(1), True))
                self.i += 2
            elif c == "$":
                segs.append(self._dollar(quoted=True))
            elif c == "`":
                end = self.s.find("`", self.i + 1)
                if end < 0:
                    raise self.error("a backtick is not closed")
                segs.append(("sub", self.s[self.i:end + 1], self.line_at(self.i)))
                self.i = end + 1
            else:
                segs.append(("lit", c, True))
                self.i += 1

    def _balanced(self, open_: str, close: str) -> int:
        """The index just past the bracket closing the one at self.i."""
        depth, j = 0, self.i
        while j < len(self.s):
            if self.s[j] == open_:
                depth += 1
            elif self.s[j] == close:
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise self.error(f"a {open_} is not closed")

    def _dollar(self, *, quoted: bool) -> _Seg:
        nxt = self.peek(1)
        if nxt == "(":
            line = self.line_at(self.i)
            self.i += 1
            end = self._balanced("(", ")")
            text = "$" + self.s[self.i:end]
            self.i = end
            return ("sub", text, line)
        if nxt == "{":
            self.i += 1
            end = self._balanced("{", "}")
            spec = self.s[self.i + 1:end - 1]
            self.i = end
            return ("var", spec, quoted)
        m = _NAME.match(self.s, self.i + 1)
        if m:
            self.i = m.end()
            return ("var", m.group(0), quoted)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.i += 2
            return ("var", nxt, quoted)
        self.i += 1
        return ("lit", "$", quoted)


# ---- expansion -----------------------------------------------------------------------------

_Value = Word | list[Word] | Ref
"""A variable's value: a scalar word, an array, or why it is unknown."""


@dataclass(slots=True)
class _Frame:
    """An open block while the script is read: an `if` whose branch the reader may know, or a
    loop, case or function (whose body it never knows runs)."""

    kind: str
    """"if", or "other" (for, while, until, case, select, a function)."""
    state: str
    """"cond": reading an if's (or elif's) condition; "take" / "skip": in a branch the condition
    decides is run / not run; "done": past the branch that runs (elif, else); "unknown": a
    branch whose condition autotune cannot tell, or the body of another block."""
    value: bool | None = None
    """The condition read so far (None: cannot tell)."""


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return True if a and b else None


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return False if a is False and b is False else None


def _string_test(args: Sequence[str], *, pattern: bool) -> bool | None:
    """A `test` / `[` / `[[` of known strings: `-z S`, `-n S`, `S`, `A = B`, `A == B`,
    `A != B` (None for any other form). In `[[ ]]` the right of == and != is a glob pattern:
    one with a pattern character is not decided."""
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2 and args[0] in ("-z", "-n"):
        return (args[1] == "") == (args[0] == "-z")
    if len(args) == 3 and args[1] in ("=", "==", "!="):
        if pattern and any(c in args[2] for c in "*?["):
            return None
        return (args[0] == args[2]) == (args[1] != "!=")
    return None


class _Reader:
    def __init__(self, source: str,
                 optional: Callable[[Sequence[Word]], bool] | None = None,
                 heredocs: Mapping[int, HereDoc] | None = None) -> None:
        self.source = source
        self.heredocs = dict(heredocs or {})  # by the line of the `sbatch` they are fed to
        self.job: JobScript | None = None  # the sbatch job script being read
        self.defer = False  # `${NAME:-word}` of the environment left for a new shell
        self.optional = optional
        self.maybe: dict[str, list[Maybe]] = {}  # per array: its conditional appends
        self.touched: dict[str, None] = {}  # arrays with some that the statement expanded
        self.vars: dict[str, _Value] = {}
        self.exported: dict[str, Word] = {}
        self.frames: list[_Frame] = []  # the blocks open where the reader is
        self.commands: list[Command] = []
        self.evals = 0
        self.produced = 0  # characters all expansions produced so far (MAX_EXPANDED_CHARS)
        self.nesting = 0  # defaults being expanded inside one another (MAX_DEFAULT_DEPTH)
        self.deadline = time.monotonic() + READ_SECONDS
        self.line = 1  # the line of the statement being read (Ref.line)
        self.wrapper: tuple[Word, ...] = ()  # the `srun ... sh -c` around the string being read
        self.unread: list[tuple[int, Word]] = []  # `sh -c STRING`s whose string is unknown
        # Reading the file's own text, lexed with the file's lines (not an eval's, a sh -c
        # string's or a job script's): only there is a `$(...)`'s line one of `heredocs`' keys.
        self.file_lines = True

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise ConfigError(f"{self.source}: reading the script took longer than "
                              f"{READ_SECONDS:g} s; a launch script reads in milliseconds")

    def lookup(self, spec: str, original: str) -> _Value | None:
        """The value `${spec}` expands to (None: unset and no default)."""
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])(\[([@*]|\d+)\])?"
                         r"(?:(:?)([-=?+])(.*))?", spec, re.S)
        if m is None:
            return Ref(original, None, f"{original}: a form of expansion autotune does not "
                                       "evaluate")
        name, index, colon, op, word = m.group(1), m.group(3), m.group(4), m.group(5), m.group(6)
        if name in ("@", "*", "#", "?", "$", "!", "-"):
            return Ref(original, None, f"{original} is only known when the script runs")
        value = self.vars.get(name)
        if name in self.maybe and isinstance(value, list):
            self.touched[name] = None
        if isinstance(value, list) and index is not None and index not in ("@", "*"):
            value = value[int(index)] if int(index) < len(value) else None
        elif isinstance(value, list) and index is None:
            value = value[0] if value else None
        unset = value is None or (colon == ":" and isinstance(value, Word)
                                  and value.text == "")
        if op is None:
            if value is None:
                reason = ("the script runs without arguments" if name.isdigit()
                          else "not set in the script (the environment may provide it)")
                return Ref(original, name, f"{original}: {reason}")
            return value
        if op in "-=":
            if not unset:
                return value
            default = self.nested(word) if word else Word.of("")
            if value is None and name not in self.vars and not name.isdigit():
                if self.defer and op == "-" and default.text is not None \
                        and _PLAIN_DEFAULT.fullmatch(default.text):
                    return Word.of("${" + name + colon + "-" + default.text + "}")
                default = Word(default.parts, default.env_defaults | {name})
            if op == "=" and not name.isdigit():
                self.vars[name] = default
            return default
        if op == "+":
            return Word.of("") if unset else self.nested(word)
        why = "the script runs without arguments" if name.isdigit() else "not set in the script"
        return value if not unset else Ref(original, name, f"{original}: {why}")

    def nested(self, word: str) -> Word:
        """The word of a `${NAME:-word}`, expanded: bounded, so that thousands of defaults
        inside one another are one line rather than a RecursionError."""
        self.nesting += 1
        try:
            if self.nesting > MAX_DEFAULT_DEPTH:
                raise ConfigError(f"{self.source}: ${{...:-...}} nested deeper than "
                                  f"{MAX_DEFAULT_DEPTH} levels")
            return self.expand_scalar(_Lexer(word, self.source).word())
        finally:
            self.nesting -= 1

    def expand(self, raw: list[_Seg], *, split: bool = True) -> list[Word]:
        """A raw word as the words it becomes (splitting unquoted expansions, arrays)."""
        words = self._expand(raw, split=split)
        self.produced += _WORD_COST * len(words) + sum(
            len(p) if isinstance(p, str) else len(p.text) for w in words for p in w.parts)
        if self.produced > MAX_EXPANDED_CHARS:
            raise ConfigError(f"{self.source}: its variables expand to more than "
                              f"{MAX_EXPANDED_CHARS // 2**20} MiB of text (a variable doubled "
                              "again and again?); a launch command is a few KiB")
        self.check_time()
        return words

    def _expand(self, raw: list[_Seg], *, split: bool) -> list[Word]:
        fields: list[list[str | Ref]] = [[]]
        env: dict[int, frozenset[str]] = {}  # a field's Word.env_defaults
        keep = False  # a quoted or literal part keeps even an empty word

        def add(parts: tuple[str | Ref, ...], quoted: bool) -> None:
            for part in parts:
                if isinstance(part, Ref) or quoted or not split:
                    fields[-1].append(part)
                    continue
                pieces = re.split(r"[ \t\n]+", part)
                for k, piece in enumerate(pieces):
                    if k:
                        fields.append([])
                    if piece:
                        fields[-1].append(piece)

        for seg in raw:
            kind = seg[0]
            if kind == "lit":
                fields[-1].append(seg[1])
                keep = True
            elif kind == "sub":
                what = "arithmetic" if seg[1].startswith("$((") else "command substitution"
                fields[-1].append(Ref(seg[1], None, f"{seg[1]}: {what}, which autotune never "
                                                    "runs", self.line))
                keep = True
            elif kind == "array":
                raise ConfigError(f"{self.source}: an array ( ... ) where a word belongs")
            else:
                _, spec, quoted = seg
                original = "${" + spec + "}" if not _NAME.fullmatch(spec) else "$" + spec
                value = self.lookup(spec, original)
                keep = keep or quoted
                if isinstance(value, Ref):
                    fields[-1].append(value)
                elif isinstance(value, Word):
                    first = len(fields) - 1
                    add(value.parts, quoted)
                    if value.env_defaults:
                        for k in range(first, len(fields)):
                            env[k] = env.get(k, frozenset()) | value.env_defaults
                elif value is not None:
                    all_of = re.search(r"\[[@*]\]", spec) is not None
                    items = value if all_of else value[:1]
                    for k, item in enumerate(items):
                        if k and split:
                            fields.append([])
                        elif k:
                            fields[-1].append(" ")
                        add(item.parts, quoted)
        words = [Word(_joined(f), env.get(k, frozenset())) for k, f in enumerate(fields)]
        return [w for w in words if w.parts or keep] if split else words[:1]

    def expand_scalar(self, raw: list[_Seg]) -> Word:
        words = self.expand(raw, split=False)
        return words[0] if words else Word.of("")

    # ---- statements ----

    def run(self, statements: list[_Statement]) -> None:
        for st in statements:
            self.statement(st)

    @property
    def depth(self) -> int:
        """Open blocks whose running autotune cannot tell: an assignment in one leaves the
        variable unknown (or, appended, a maybe)."""
        return sum(f.state == "unknown" for f in self.frames)

    def skipping(self) -> bool:
        """Whether the statement lies in a branch the script does not run."""
        return any(f.state in ("skip", "done") for f in self.frames)

    def test(self, raw: list[list[_Seg]]) -> bool | None:
        """A condition's command, decided where it is `test`, `[ ]` or `[[ ]]` of strings the
        script sets (never run: compared here); None for any other command or an unknown
        word."""
        words = [self.expand_scalar(r) for r in raw]
        texts = [w.text for w in words]
        if not texts or any(t is None for t in texts):
            return None
        args = [t for t in texts if t is not None]
        negate = args[0] == "!"
        args = args[1:] if negate else args
        if args[:1] == ["[["] and args[-1:] == ["]]"]:
            value = _string_test(args[1:-1], pattern=True)
        elif args[:1] == ["["] and args[-1:] == ["]"]:
            value = _string_test(args[1:-1], pattern=False)
        elif args[:1] == ["test"]:
            value = _string_test(args[1:], pattern=False)
        else:
            return None
        return None if value is None else value != negate

    def condition(self, frame: _Frame, st: _Statement) -> None:
        """Another command of an if's condition: `&&`, `||` or `;` before it."""
        value = self.test(st.words)
        if "&&" in st.joined:
            frame.value = _and(frame.value, value)
        elif "||" in st.joined:
            frame.value = _or(frame.value, value)
        else:  # `;`, a newline or a pipe: the last command's status decides
            frame.value = None if "|" in st.joined else value

    def block_words(self, st: _Statement) -> list[list[_Seg]] | None:
        """The statement's words after the block keywords it starts with, the frames opened
        and closed by them; None when nothing of it is a command autotune follows."""
        words = list(st.words)
        top = self.frames[-1] if self.frames else None
        head = _literal(words[0]) if words else None
        if top is not None and top.state == "cond" and head != "then":
            self.condition(top, st)
            return None
        while head in _BLOCK_MIDDLE or head in _BLOCK_CLOSE or head in _BLOCK_OPEN or (
                head is not None and head.endswith("()")):
            top = self.frames[-1] if self.frames else None
            if head in _BLOCK_CLOSE:
                if self.frames:
                    self.frames.pop()
            elif head == "if":
                if self.skipping():
                    self.frames.append(_Frame("if", "done"))
                else:
                    self.frames.append(_Frame("if", "cond", self.test(words[1:])))
                return None
            elif head in _BLOCK_OPEN or (head is not None and head.endswith("()")):
                self.frames.append(_Frame("other", "unknown"))
                if head in ("while", "until", "case", "for", "select"):
                    return None  # the condition or list of a block: nothing autotune follows
            elif top is not None and top.kind == "if":
                if head == "then" and top.state == "cond":
                    top.state = {True: "take", False: "skip", None: "unknown"}[top.value]
                elif head == "elif":
                    if top.state == "skip":
                        top.state, top.value = "cond", self.test(words[1:])
                    elif top.state == "take":
                        top.state = "done"
                    return None
                elif head == "else":
                    top.state = {"take": "done", "skip": "take"}.get(top.state, top.state)
            words = words[1:]
            head = _literal(words[0]) if words else None
        return words

    def statement(self, st: _Statement) -> None:
        self.check_time()
        self.line = st.line
        self.touched = {}
        words = self.block_words(st)
        if words is None:
            return
        for raw in words:
            self.submission(raw)
        if words and self.skipping() and (_leading_assignment(words[0]) is not None
                                          or _literal(words[0]) in (*_DECLARE, "unset")):
            return  # an assignment in a branch the script does not run
        assignments: list[tuple[str, str, list[_Seg]]] = []
        while words:
            m = _leading_assignment(words[0])
            if m is None:
                break
            assignments.append(m)
            words = words[1:]
        if not words:
            for name, op, raw in assignments:
                self.assign(name, op, raw, export=False)
            return
        command = _literal(words[0])
        if command in _DECLARE:
            for raw in words[1:]:
                literal = _literal(raw)
                if literal is not None and literal.startswith("-"):  # declare -x, export -n
                    continue
                m = _leading_assignment(raw)
                value = self.vars.get(literal) if literal is not None else None
                if m is not None:
                    self.assign(*m, export=command == "export")
                elif command == "export" and literal is not None and isinstance(value, Word):
                    self.exported[literal] = value
            return
        if command == "unset":
            for raw in words[1:]:
                gone = _literal(raw)
                if gone is not None:
                    self.vars.pop(gone, None)
                    self.exported.pop(gone, None)
            return
        env = tuple((name, self.expand_scalar(raw)) for name, op, raw in assignments
                    if raw and raw[0][0] != "array")
        per_raw = [self.expand(raw) for raw in words]
        expanded = [w for ws in per_raw for w in ws]
        if command == "eval":
            self.eval(expanded[1:], st.line)
            return
        shell_c = shell_string(expanded)
        if shell_c is not None:
            string = shell_c[1]
            if string.env_defaults:
                string = self.deferring_defaults(words, per_raw, string)
            self.shell(expanded[:shell_c[0]], string, st.line)
            return
        doc = self.heredocs.pop(st.line, None) \
            if (command or "").rsplit("/", 1)[-1] == "sbatch" else None
        if doc is not None:
            self.job_script(tuple(expanded), doc)
            return
        maybe = tuple(m for name in self.touched for m in self.maybe.get(name, ()))
        self.commands.append(Command(tuple(expanded), env, tuple(self.exported.items()),
                                     st.line, maybe, self.wrapper, self.job, self.depth > 0))

    def submission(self, raw: list[_Seg]) -> None:
        """`JOBID=$(sbatch --parsable <<EOF ... EOF)`: a command substitution whose one command
        is an sbatch fed a here-document submits that job script as `sbatch <<EOF` does (what
        it captures is sbatch's output, the job id), so the job script is read as that one's;
        the substitution itself is never run and its value stays unknown. Any other `$(...)`
        is left as it was."""
        if not self.file_lines:
            return
        for seg in raw:
            if seg[0] != "sub" or not seg[1].startswith("$(") or seg[1].startswith("$(("):
                continue
            try:
                inner = _Lexer(seg[1][2:-1], self.source).statements()
            except ConfigError:
                continue  # text autotune does not lex stays an unknown word, as before
            if len(inner) != 1 or (_literal(inner[0].words[0]) or "").rsplit("/", 1)[-1] \
                    != "sbatch":
                continue
            doc = self.heredocs.pop(seg[2] + inner[0].line - 1, None)
            if doc is not None:
                self.job_script(tuple(w for r in inner[0].words for w in self.expand(r)), doc)

    def assign(self, name: str, op: str, raw: list[_Seg], *, export: bool) -> None:
        if self.depth and self.appends_optional(name, op, raw):
            return
        old_value = self.vars.get(name)
        if op == "+" and isinstance(old_value, Ref) and old_value.name == name:
            return  # appended to a value autotune cannot tell: it stays unknown
        if self.depth:
            self.vars[name] = Ref("$" + name, name, f"${name} is set inside an if/for/case "
                                                   "block or a function, whose condition "
                                                   "autotune cannot decide without running it")
            return
        if raw and raw[0][0] == "array":
            self.touched = {}
            items = [w for element in raw[0][1] for w in self.expand(element)]
            old = self.vars.get(name)
            # An array built from one with conditional words may hold them too.
            maybe = [m for n in self.touched for m in self.maybe.get(n, ())]
            if op == "+" and isinstance(old, list):
                items = old + items
                maybe = self.maybe.get(name, []) + maybe
            self.maybe[name] = list(dict.fromkeys(maybe))
            self.vars[name] = items
            return
        value = self.expand_scalar(raw)
        old = self.vars.get(name)
        if op == "+" and isinstance(old, Word):
            value = Word(old.parts + value.parts)
        self.vars[name] = value
        if export or name in self.exported:
            self.exported[name] = value

    def appends_optional(self, name: str, op: str, raw: list[_Seg]) -> bool:
        """Inside a block: `NAME+=( ... )` (or `NAME=( "${NAME[@]}" ... )`) onto an array set
        before it, of words the caller may leave out (`optional`): the array keeps its
        value and the words are noted as maybe (Command.maybe)."""
        old = self.vars.get(name)
        if self.optional is None or not isinstance(old, list) or not raw \
                or raw[0][0] != "array":
            return False
        items = [w for element in raw[0][1] for w in self.expand(element)]
        if op != "+":
            if [w.parts for w in items[:len(old)]] != [w.parts for w in old]:
                return False
            items = items[len(old):]
        if not self.optional(items):
            return False
        self.maybe.setdefault(name, []).append(Maybe(name, self.line, tuple(items)))
        return True

    def eval(self, words: list[Word], line: int) -> None:
        self.evals += 1
        if self.evals > 100:
            raise ConfigError(f"{self.source}: too many nested evals")
        # The text is lexed again. A variable of the environment stays a variable ("${NAME}");
        # any other part autotune cannot tell ($(date), $((...)), a variable set in an if)
        # goes back as it was written, so that it reads as the same unknown word it was
        # before the eval: refused where autotune needs it or where flags go, carried
        # elsewhere (as without eval).
        text = " ".join("".join(p if isinstance(p, str) else f'"${{{p.name}}}"' if p.plain
                                else p.text for p in w.parts) for w in words)
        file_lines, self.file_lines = self.file_lines, False
        try:
            for st in _Lexer(text, self.source).statements():
                st.line = line
                self.statement(st)
        finally:
            self.file_lines = file_lines

    def shell(self, wrapper: list[Word], string: Word, line: int) -> None:
        """`[srun ...] sh -c STRING`: the string read as the script a new shell runs. Its
        words are the string's text after this script's expansion (done: `string`), lexed
        again with bash's quoting; the new shell sees only the variables this script exported
        (and the environment), none of its arrays, and what it sets stays in it. Each command
        found keeps the words before the shell (`srun` and its options) as its wrapper."""
        self.evals += 1
        if self.evals > 100:
            raise ConfigError(f"{self.source}: too many nested evals or sh -c strings")
        if string.refs:
            self.unread.append((line, string))
        statements = _Lexer(_written_back(string), self.source).statements()
        for st in statements:
            st.line = line
        self.new_shell(statements, "the sh -c string's shell", wrapper=wrapper)

    def deferring_defaults(self, raw: list[list[_Seg]], expanded: list[list[Word]],
                           string: Word) -> Word:
        """A `sh -c "... ${NAME:-1} ..."` string expanded again with each default of a
        variable the script never sets left as `${NAME:-1}`: the new shell has the same
        environment, so it expands to the same, and read there, the word keeps where it comes
        from (torchrun's --nnodes ${SLURM_NNODES:-1}: Slurm's count, not the script's 1)."""
        at = next((k for k, words in enumerate(expanded) if words == [string]), None)
        if at is None:
            return string
        self.defer = True
        try:
            return self.expand_scalar(raw[at])
        finally:
            self.defer = False

    def job_script(self, sbatch: tuple[Word, ...], doc: HereDoc) -> None:
        """`sbatch <<EOF`: the here-document read as the job script sbatch runs, in a shell of
        its own that has the variables this script exported (sbatch passes its environment
        on). Where the delimiter is unquoted, this script expands the text first (as a
        double-quoted string, but quotes are text), one line at a time so that each
        command keeps its line in the file."""
        text, lines, defaults = self.heredoc_text(doc)
        statements = _Lexer(text, self.source).statements()
        for st in statements:
            st.line = lines[min(st.line, len(lines)) - 1]
        self.new_shell(statements, "the sbatch job script",
                       job=JobScript(text, sbatch[1:], defaults))

    def heredoc_text(self, doc: HereDoc) -> tuple[str, list[int], frozenset[str]]:
        """The here-document's text as sbatch gets it, the file's line of each of its lines,
        and the environment's variables whose defaults this script expanded into it."""
        lines = doc.text.split("\n")
        if not doc.expands:
            return doc.text, [doc.line + k for k in range(len(lines))], frozenset()
        out: list[str] = []
        where: list[int] = []
        defaults: set[str] = set()
        k = 0
        while k < len(lines):
            first, chunk = k, lines[k]
            while True:
                continued = (len(chunk) - len(chunk.rstrip("\\"))) % 2 == 1
                try:
                    if continued and k + 1 < len(lines):
                        raise _MoreLines()
                    segs = _Lexer(chunk, self.source).heredoc()
                    break
                except (ConfigError, _MoreLines):
                    # A `\` line continuation, or a `$(...)` / `${...}` over several lines:
                    # expanded with the next line, as the shell reads it.
                    if k + 1 >= len(lines):
                        raise ConfigError(f"{self.source}: line {doc.line + first}: the "
                                          "here-document fed to sbatch does not expand "
                                          "(an unclosed quote or bracket)") from None
                    k += 1
                    chunk += "\n" + lines[k]
            word = self.expand_scalar(segs)
            defaults |= word.env_defaults
            expanded = _written_back(word)
            out.append(expanded)
            where += [doc.line + first] * (expanded.count("\n") + 1)
            k += 1
        return "\n".join(out), where, frozenset(defaults)

    def new_shell(self, statements: list[_Statement], what: str, *,
                  wrapper: Sequence[Word] = (), job: JobScript | None = None) -> None:
        """Statements read as a new shell runs them: with the variables this script exported
        (and the environment), none of its arrays; what they set stays in it."""
        saved = (self.vars, self.exported, self.maybe, self.frames, self.wrapper, self.job,
                 self.file_lines)
        # A variable it did not export is not the new shell's; one autotune could not tell
        # (set in an if) keeps its reason.
        self.vars = {name: value if isinstance(value, Ref) else
                     Ref(f"${name}", name, f"${name} is set in the script but not exported, so "
                         f"{what} does not have it")
                     for name, value in saved[0].items() if name not in saved[1]}
        self.vars.update(saved[1])
        self.exported = dict(saved[1])
        self.maybe, self.frames = {}, []
        self.wrapper = (*saved[4], *wrapper)
        self.job = job or saved[5]
        self.file_lines = False
        try:
            for st in statements:
                self.statement(st)
        finally:
            (self.vars, self.exported, self.maybe, self.frames, self.wrapper, self.job,
             self.file_lines) = saved


class _MoreLines(Exception):
    """A here-document line that continues on the next (it ends in a backslash)."""


def _written_back(word: Word) -> str:
    """An expanded word as text for a new shell to lex again (a `sh -c` string, a job
    script). A part autotune cannot tell goes back as written (as for eval): an environment
    variable stays "${NAME}", for the new shell to take from the same environment."""
    return "".join(p if isinstance(p, str) else f'"${{{p.name}}}"' if p.plain else p.text
                   for p in word.parts)


def shell_string(words: Sequence[Word]) -> tuple[int, Word] | None:
    """(the index of the shell, the string it runs) when the command is `[WRAPPER...] sh -c
    STRING [NAME ARGS...]` (bash, sh, ... with -c in its options); else None."""
    at = shell_c_at([(w.text, w.shown()) for w in words])
    return None if at is None else (at[0], words[at[1]])


def shell_c_at(words: Sequence[tuple[str | None, str]]) -> tuple[int, int] | None:
    """The indices of the shell and of STRING in `[WRAPPER...] sh -c STRING [NAME ARGS...]`
    (bash, sh, ... with -c in its options), from each word's literal text (None where it is not
    plain) and its text as written; None for any other command. The one reading of that shape
    for the evaluator (shell_string) and the export's patch (autotune.megatron.script_patch)."""
    for k, (text, written) in enumerate(words):
        if written.endswith(".py"):
            return None  # a shell's name after the program is one of its arguments
        if (text or "").rsplit("/", 1)[-1] not in _SHELLS:
            continue
        for j in range(k + 1, len(words)):
            flag = words[j][0] or ""
            if not flag.startswith("-"):
                return None
            if _SHELL_C.fullmatch(flag):
                return (k, j + 1) if j + 1 < len(words) else None
        return None
    return None



def _joined(parts: list[str | Ref]) -> tuple[str | Ref, ...]:
    """Parts with adjacent text joined: `--data-path=`, Ref, `/x` rather than one per char."""
    out: list[str | Ref] = []
    for part in parts:
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        elif part != "":
            out.append(part)
    return tuple(out)


def _literal(raw: list[_Seg]) -> str | None:
    """A raw word's text when it is unquoted literal text only (a keyword, a name)."""
    if all(seg[0] == "lit" and not seg[2] for seg in raw):
        return "".join(seg[1] for seg in raw)
    return None


def _leading_assignment(raw: list[_Seg]) -> tuple[str, str, list[_Seg]] | None:
    """(name, '+' or '', the value's segments) when the word is `NAME=...` / `NAME+=...`."""
    prefix = ""
    for k, seg in enumerate(raw):
        if seg[0] != "lit" or seg[2]:
            break
        prefix += seg[1]
        m = _ASSIGN.fullmatch(prefix)
        if m:
            return m.group(1), m.group(2), raw[k + 1:]
    return None


def read_commands(text: str, source: str,
                  optional: Callable[[Sequence[Word]], bool] | None = None) -> list[Command]:
    """The simple commands of a script, in order, with their words expanded as far as the
    script's own assignments allow; nothing in it is run. Words appended to an array inside a
    block (whose condition autotune does not run) that `optional` says may be left out are
    (Command.maybe); any other assignment in a block leaves the variable unknown (a Ref)."""
    return read_script_commands(text, source, optional)[0]


def read_script_commands(text: str, source: str,
                         optional: Callable[[Sequence[Word]], bool] | None = None,
                         heredocs: Mapping[int, HereDoc] | None = None
                         ) -> tuple[list[Command], list[tuple[int, Word]]]:
    """read_commands' commands, and the `sh -c STRING`s (line, string) whose string holds a
    part autotune cannot tell: where no launch is found, one of them may be it. `heredocs`:
    the `sbatch <<EOF` job scripts, by the line of their `sbatch` (the text has them blanked);
    their commands are read too (Command.job)."""
    reader = _Reader(source, optional, heredocs)
    reader.run(_Lexer(text, source).statements())
    return reader.commands, reader.unread
