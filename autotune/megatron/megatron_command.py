"""A user's own Megatron-LM command, read: its model, layout and GPUs, and every other flag kept.

`read_megatron_command(path)` finds the `pretrain_gpt.py` launch of a shell script with a real
shell parser (autotune.megatron.launch_site: one launch the shell runs as written, or the line
`--line N` names), reads its words with autotune.megatron.shell_script (variables, arrays and eval
expanded, here-document text left out but for the job script of `sbatch <<EOF`, read as sbatch
runs it; nothing in it is run) and the model and parallel flags with
the flag table `autotune export` writes (autotune.megatron.megatron_args.FLAG_TABLE).
`layout_changes` says which rows of the table a better layout changes;
autotune.megatron.script_patch edits exactly those flags in the user's file.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError, MissingFlagError
from autotune.inputs.untrusted import for_terminal
from autotune.layouts.layout import DIMENSIONS, Layout, derive_dp
from autotune.levers import LEVERS
from autotune.megatron.environment import environment_fields, run_environment
from autotune.megatron.launch_site import (
    NOT_RUN,
    Candidate,
    Script,
    find_launch,
    parse_script,
    read_script,
    sbatch_heredocs,
    walk,
)
from autotune.megatron.megatron_args import (
    FLAG_TABLE,
    PIPELINE_LAYOUT,
    TRAINING_SCRIPT,
    UNMODELED_DEFAULTS,
    UNMODELED_FLAGS,
    UNREPRESENTED_FLAGS,
    Given,
    Part,
    exported_layout,
    known_flags,
    read_fields,
    row_args,
)
from autotune.megatron.pipeline_layout import (
    CONFLICTS,
    LAYOUT_FLAG,
    format_layout,
    split_fields,
)
from autotune.megatron.shell_script import (
    SCRIPT_ARGUMENTS,
    Command,
    Maybe,
    Ref,
    Word,
    read_script_commands,
)
from autotune.megatron.slurm import SlurmCount, sbatch_options, srun_processes
from autotune.specs.model import MODEL_NAME_MAX, ModelSpec

__all__ = [
    "ArgGroup",
    "MegatronCommand",
    "RowChange",
    "arithmetic_warning",
    "conditional_warning",
    "exported_layout",
    "flag_values",
    "ignored_warning",
    "job_script_warning",
    "layout_changes",
    "megatron_layout",
    "read_megatron_command",
    "unmodeled_warning",
]

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_PYTHON = re.compile(r"(.*/)?python[0-9.]*$")


@dataclass(frozen=True, slots=True)
class ArgGroup:
    """One flag of the command with the words that follow it (its values), as written; `flag`
    is None for words before any flag."""

    flag: str | None
    words: tuple[Word, ...]

    @property
    def values(self) -> list[str | None]:
        """The flag's values as written, `--flag=value`'s too (an unknown flag's group keeps
        its first word whole); None for a word autotune cannot tell."""
        first = (self.words[0].text or "") if self.flag is not None else ""
        return ([first.partition("=")[2]] if "=" in first else []) + \
            [w.text for w in self.words[1:]]


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronCommand:
    """What autotune read from a user's pretrain_gpt.py command."""

    source: str
    """The file, for messages."""
    line: int
    env: tuple[tuple[str, Word], ...]
    """`NAME=value` prefixes of the command."""
    exported: tuple[tuple[str, Word], ...]
    """Variables the script exported before the command (CUDA_DEVICE_MAX_CONNECTIONS, ...)."""
    launcher: tuple[Word, ...]
    """torchrun and its options, or python: the words before the training script."""
    script: Word
    groups: tuple[ArgGroup, ...]
    model: ModelSpec
    layout_fields: dict[str, Any]
    """Layout fields the flags give (every one but dp, which follows from the GPUs)."""
    gpus_per_node: int | None
    nodes: int | None
    gpus_unknown: str | None
    """Why the launcher does not tell the GPU count (None when it does)."""
    parsed: Script
    """The file as read and parsed: what autotune.megatron.script_patch edits."""
    site: Candidate
    """The launch command in it."""
    maybe: tuple[Maybe, ...] = ()
    """Flags an array of the command may also hold, appended inside a block autotune does not
    run; none of them is one autotune reads (conditional_warning names them)."""
    launcher_env: tuple[str, ...] = ()
    """Variables the script never sets whose defaults gave torchrun's --nproc-per-node or
    --nnodes (`${SLURM_NNODES:-1}`): the environment's when it runs, so --gpus overrides."""
    sbatch_nodes: int | None = None
    """torchrun's --nnodes as Slurm will set it (`${SLURM_NNODES:-1}`: the script's
    `#SBATCH --nodes`), where it read that and not the script's default; --gpus overrides it,
    as sbatch's command line overrides #SBATCH lines."""
    sbatch_nodes_from: str = "the script's #SBATCH"
    """Where sbatch_nodes was read: the #SBATCH lines, or sbatch's own options of `sbatch -N 4
    <<EOF` (which override them)."""
    job_script: bool = False
    """The launch is in the job script of `sbatch <<EOF` (a here-document): read, its #SBATCH
    lines and sbatch's own options taken, but not edited (autotune.megatron.script_patch)."""
    submit_defaults: tuple[str, ...] = ()
    """For such a launch, the environment's variables whose defaults the script expanded into
    the job script when it submits it (shell_script.JobScript.submit_defaults)."""
    slurm_source: str | None = None
    """Where Slurm's task count came from for an `srun python pretrain_gpt.py` launch ("srun"
    or "#SBATCH"; autotune.megatron.slurm); None for torchrun or python. sbatch's own command
    line can override #SBATCH lines when the job is submitted, so --gpus overrides."""

    @property
    def gpus(self) -> int | None:
        if self.gpus_per_node is None or self.nodes is None:
            return None
        return self.gpus_per_node * self.nodes

    @property
    def layout_string(self) -> str | None:
        """The command's --pipeline-model-parallel-layout as written (its last occurrence, as
        argparse takes it), or None without one."""
        found = [g for g in self.groups if g.flag == LAYOUT_FLAG]
        if not found:
            return None
        return " ".join(v if v is not None else "?" for v in found[-1].values)

    @property
    def unmodeled(self) -> tuple[str, ...]:
        """The command's flags that change its speed or memory in ways autotune does not
        model (megatron_args.UNMODELED_FLAGS), each once, in the command's order."""
        def default(group: ArgGroup) -> bool:
            given = group.values
            if group.flag == "--expert-tensor-parallel-size":
                # megatron-core's default is the tensor-parallel size, which autotune runs.
                return given == [str(self.layout_fields.get("tp", 1))]
            return given == [UNMODELED_DEFAULTS.get(group.flag or "")]

        return tuple(dict.fromkeys(g.flag for g in self.groups if g.flag is not None
                                   and g.flag in UNMODELED_FLAGS and not default(g)))


def arithmetic_warning(command: MegatronCommand) -> str | None:
    """One line naming the `$((...))` left in the command's flags: none of them is a value
    autotune needs (those are refused as they are read), so each is carried as written into
    the export, never evaluated; None when there are none."""
    found = [f"{g.flag or g.words[0].shown()} {r.text}" + (
        f" (set on line {r.line})" if r.line not in (None, command.line) else "")
        for g in command.groups for w in g.words for r in w.refs if r.arithmetic]
    if not found:
        return None
    return (f"{command.source}: line {command.line}: {'; '.join(dict.fromkeys(found))}: "
            "arithmetic, which autotune never runs; not a value it needs, so the export "
            "carries it as written")


def ignored_warning(command: MegatronCommand, layout: Layout) -> str | None:
    """One line naming what in the command changes nothing, so that a user does not believe
    it tuned: a flag given more than once (Megatron-LM's argparse keeps the last, and so does
    autotune) and a flag Megatron leaves unread in this layout (Lever.unread: --fp8-recipe
    without --fp8-format, --recompute-method without full recompute); None when there is none."""
    known = known_flags()
    counts = Counter(g.flag for g in command.groups if g.flag in known)
    # The script's own text, shown on one line (a quoted value may hold a newline).
    last = {g.flag: for_terminal(" ".join(v or "?" for v in g.values)) for g in command.groups
            if g.flag in known}
    repeated = [f"{flag} is given {n} times: only the last"
                + (f" ({last[flag]})" if last[flag] else "") + " counts, as in Megatron-LM"
                for flag, n in counts.items() if n > 1]
    unread = [f"{flag} has no effect ({u.reason})" for lever in LEVERS for u in lever.unread
              if u.when(layout) for flag in u.flags if flag in counts]
    found = [*repeated, *dict.fromkeys(unread)]
    if not found:
        return None
    return f"{command.source}: line {command.line}: {'; '.join(found)}"


def _optional(words: Sequence[Word]) -> bool:
    """Whether words appended inside an if/for/case block may be left out: none is a flag
    autotune reads, or one that changes the model, speed or memory, and a word autotune cannot
    tell ($VAR) stands only as a flag's value."""
    known = known_flags()
    for k, word in enumerate(words):
        if word.text is None:
            # A word autotune cannot tell is a value only right after a flag (as _group
            # reads it); anywhere else it may hold flags.
            after = words[k - 1].text if k else None
            if after is None or not after.startswith("-") or "=" in after:
                return False
            continue
        name = word.text.partition("=")[0]
        if name.startswith("-") and (name in known or name in UNMODELED_FLAGS
                                     or name in UNREPRESENTED_FLAGS):
            return False
    return True


def conditional_warning(command: MegatronCommand) -> str | None:
    """One line for the flags an array of the command gets only when a block autotune does
    not run runs (none of them one it reads): the command is read without them."""
    if not command.maybe:
        return None
    named = "; ".join(
        f"line {m.line}: {m.name} += "
        + ", ".join(for_terminal(w.text or "") for w in m.words
                    if (w.text or "").startswith("-"))
        for m in command.maybe)
    return (f"{command.source}: {named} (inside an if/for/case block or a function, whose "
            "conditions autotune does not run): read without them; none is a flag autotune "
            "reads or one that changes speed or memory")


def unmodeled_warning(command: MegatronCommand) -> str | None:
    """One line naming the command's flags autotune does not model, with what each changes;
    None when it has none."""
    flags = command.unmodeled
    given = {g.flag for g in command.groups}
    fp32 = None if given & {"--bf16", "--fp16"} else (
        "neither --bf16 nor --fp16 (Megatron-LM then trains in fp32; autotune's predictions "
        "and trials are bf16: add --bf16 to compare like with like)")
    if not flags:
        return None if fp32 is None else f"{command.source}: the command has {fp32}"
    named = "; ".join(f"{flag} ({UNMODELED_FLAGS[flag]})" for flag in flags)
    return (f"{command.source}: autotune does not model {named}: its predictions and trials "
            "run without them, your command with them"
            + ("" if fp32 is None else f"; and the command has {fp32}"))


def _is_script(word: Word) -> bool:
    text = word.shown()
    return text.endswith(TRAINING_SCRIPT) and not text.startswith("-")


def _launches(commands: list[Command]) -> list[Command]:
    return [c for c in commands if any(_is_script(w) for w in c.words)
            and (c.words[0].text or "") not in NOT_RUN]


def _find(parsed: Script, line: int | None) -> tuple[Command, Candidate]:
    """The launch the shell runs (or the one `line` names), as the evaluator expands it."""
    source = parsed.source
    commands, unread = read_script_commands(_without_heredoc_text(parsed), source, _optional,
                                            sbatch_heredocs(parsed))
    launches = _launches(commands)
    # Each launch's line, with the first word of the command written there (srun of
    # `srun ... sh -c "$CMD"`, eval of `eval $cmd`): the command to find on that line.
    site = find_launch(parsed, {c.line: (c.wrapper or c.words)[0].text for c in launches
                                if c.job is None}, line,
                       {c.line: c.in_block for c in launches if c.job is not None})
    if site is None and unread:
        # `srun ... sh -c "${CMD}"` with CMD from the environment (Megatron-LM's sc21/SRUN.sh):
        # the launch may be in that string; say so rather than "no command".
        at, string = unread[0]
        ref = string.refs[0]
        raise ConfigError(f"{source}: line {at}: sh -c {for_terminal(string.shown())[:80]}: "
                          f"{ref.reason.removeprefix(ref.text + ': ')}; autotune cannot tell "
                          f"whether it runs {TRAINING_SCRIPT}: write the launch in the script, "
                          "or set the variable before it")
    if site is None:
        raise ConfigError(f"{source} holds no {TRAINING_SCRIPT} command (autotune reads a "
                          f"`torchrun ... {TRAINING_SCRIPT} --flags` or `python "
                          f"{TRAINING_SCRIPT} --flags` line)")
    found = [c for c in launches if c.line == site.line]
    if len(found) != 1:
        why = "several launches" if found else "no launch autotune can expand"
        raise ConfigError(f"{source}: line {site.line} holds {why} of {TRAINING_SCRIPT}")
    return found[0], site


def _without_heredoc_text(parsed: Script) -> str:
    """The script with its here-documents' text and end markers blanked (newlines kept, so the
    lines stay): to the shell they are data for a command, never commands of the script."""
    data = bytearray(parsed.data)
    for node, _ in walk(parsed.root):
        if node.type in ("heredoc_body", "heredoc_end"):
            for k in range(node.start_byte, node.end_byte):
                if data[k] != 0x0A:
                    data[k] = 0x20
    return data.decode("utf-8")


def _sbatch(command: Command, text: str) -> dict[str, str]:
    """The task-count options sbatch runs the launch with: the file's #SBATCH lines, or for a
    launch in an `sbatch <<EOF` job script, that script's lines under sbatch's own options."""
    if command.job is None:
        return sbatch_options(text)
    # A word autotune cannot tell stays one (no count): a value the job is given elsewhere.
    given = [w.text if w.text is not None else w.shown() for w in command.job.sbatch]
    return sbatch_options(command.job.text, given)


def _slurm_source(command: Command, slurm: SlurmCount | None) -> str | None:
    """Where srun's task count came from, for the line that says so: sbatch's own options of
    `sbatch -N 4 <<EOF` are not the job script's #SBATCH lines."""
    if slurm is None or slurm.why:
        return None
    if slurm.source == "#SBATCH" and command.job is not None and sbatch_options(
            "", [w.shown() for w in command.job.sbatch]):
        return "sbatch command-line and #SBATCH"
    return slurm.source


def _nodes_from(command: Command) -> str:
    """Where sbatch takes its node count from, for the line that says so."""
    if command.job is not None and "nodes" in sbatch_options(
            "", [w.shown() for w in command.job.sbatch]):
        return "sbatch's command line"
    return "the script's #SBATCH"


def job_script_warning(command: MegatronCommand) -> str | None:
    """One line for a launch read from the job script of `sbatch <<EOF`: where it is, and
    that `autotune export` does not edit it; None for any other launch."""
    if not command.job_script:
        return None
    # Slurm's node count written unescaped in an unquoted <<EOF: expanded when the job is
    # submitted, where Slurm has not set it, so the job runs with the script's default.
    early = sorted(set(command.submit_defaults) & set(SLURM_NODE_COUNT))
    submitted = "".join(
        f"; ${{{name}:-...}} is expanded when the job is submitted (the here-document's "
        f"delimiter is unquoted), where Slurm has not set it: write \\${{{name}:-...}} for the "
        "job's own count" for name in early[:1])
    return (f"{command.source}: line {command.line}: the launch is in the here-document fed to "
            "sbatch, read as the job script sbatch runs (its #SBATCH lines count); `autotune "
            f"export` does not edit here-document text: change its flags by hand{submitted}")


def _srun_gpus(launcher: tuple[Word, ...], sbatch: dict[str, str]) -> SlurmCount | None:
    """Slurm's task count where srun launches python (one process per GPU) without torchrun;
    None for any other launcher."""
    texts = [w.text for w in launcher]
    if not texts or texts[0] is None or texts[0].rsplit("/", 1)[-1] != "srun":
        return None
    if any(t is not None and (t.rsplit("/", 1)[-1] == "torchrun" or t in _LAUNCHERS)
           for t in texts):
        return None  # srun starts torchrun (`srun ... sh -c "torchrun ..."`): torchrun's count
    return srun_processes(texts[1:], sbatch, [w.shown() for w in launcher[1:]])


def _launcher_gpus(launcher: tuple[Word, ...], source: str
                   ) -> tuple[int | None, int | None, str | None, tuple[str, ...],
                              frozenset[str]]:
    """(GPUs per node, nodes, why unknown, the environment's defaults among them, those of
    --nnodes alone) from torchrun's options, or one process for python."""
    texts = [w.text for w in launcher]
    at = next((k for k, t in enumerate(texts) if t is not None and (
        t.rsplit("/", 1)[-1] == "torchrun" or t in _LAUNCHERS)), None)
    if at is None:
        first = texts[0] if texts else None
        if not launcher or (first is not None and _PYTHON.match(first)):
            return 1, 1, None, (), frozenset()  # one process: pretrain_gpt.py on one GPU
        shown = launcher[0].shown()
        return None, None, f"the command is launched by {shown}, not torchrun", (), frozenset()
    options: dict[str, Word] = {}
    rest = launcher[at + 1:]
    for k, word in enumerate(rest):
        text = word.text or ""
        name, eq, value = text.partition("=")
        name = name.replace("_", "-")
        if name in ("--nproc-per-node", "--nnodes"):
            if eq:
                options[name] = Word((value,), word.env_defaults)
            elif k + 1 < len(rest):
                options[name] = rest[k + 1]
    values: list[int | None] = []
    env: list[str] = []
    for option, default in (("--nproc-per-node", 1), ("--nnodes", 1)):
        given = options.get(option)
        if given is None:
            values.append(default)
            continue
        count = given.text
        if count is None or not count.isdigit() or int(count) < 1:
            why = given.refs[0].reason if given.refs else \
                f"{option} {given.shown()} is not a count"
            return None, None, why, (), frozenset()
        values.append(int(count))
        env += sorted(given.env_defaults)
    nnodes = options.get("--nnodes")
    return values[0], values[1], None, tuple(env), \
        frozenset() if nnodes is None else nnodes.env_defaults


SLURM_NODE_COUNT = ("SLURM_NNODES", "SLURM_JOB_NUM_NODES")
"""The variables in which Slurm gives a job step its allocation's node count (sbatch.html,
"OUTPUT ENVIRONMENT VARIABLES"): sbatch's --nodes, from its command line or #SBATCH lines."""


def _sbatch_nodes(nnodes_env: frozenset[str], sbatch: dict[str, str]) -> int | None:
    """The node count Slurm will put in torchrun's `--nnodes ${SLURM_NNODES:-1}`: the script's
    `#SBATCH --nodes N` (a plain count), where --nnodes reads one of SLURM_NODE_COUNT
    (`nnodes_env`: the environment's defaults in its value); None where it does not, or the
    script has no such line (the script's default stands then)."""
    if not nnodes_env & set(SLURM_NODE_COUNT):
        return None
    nodes = sbatch.get("nodes", "")
    return int(nodes) if nodes.isdigit() and int(nodes) > 0 else None


def _group(args: tuple[Word, ...], source: str,
           line: int) -> tuple[tuple[ArgGroup, ...], Given]:
    """The arguments grouped by flag, and the known flags' values for the table to read."""
    known = known_flags()
    groups: list[ArgGroup] = []
    values: dict[str, str | None] = {}
    unresolved: dict[str, Ref] = {}
    k = 0
    while k < len(args):
        word = args[k]
        text = word.text
        if text is not None and text.startswith("--"):
            name, eq, value = text.partition("=")
            flag = known.get(name)
            if flag is not None and flag.takes_value and not eq:
                end = k + 2
                if flag.many:
                    while end < len(args) and not (args[end].text or "").startswith("--"):
                        end += 1
                taken = args[k + 1:end]
                if not taken or (taken[0].text or "").startswith("--"):
                    raise ConfigError(f"{source}: {name} has no value")
                groups.append(ArgGroup(name, (word, *taken)))
                refs = [r for w in taken for r in w.refs]
                if refs:
                    unresolved[name] = refs[0]
                else:
                    values[name] = " ".join(w.text or "" for w in taken)
                k = end
                continue
            if flag is not None:
                if not flag.takes_value and eq:
                    raise ConfigError(f"{source}: {name} takes no value, got {text!r}")
                values[name] = value if eq else None
                groups.append(ArgGroup(name, (word,)))
                k += 1
                continue
            # A flag autotune does not know: kept with the words that follow it. A word
            # autotune cannot tell ($VAR set in an if) is its value only where a value can
            # stand: right after it, and where Megatron-LM's parser gives it one; elsewhere it
            # may hold flags, and is refused below.
            j = k + 1
            while j < len(args) and not (args[j].text or "").startswith("--"):
                if args[j].text is None and (j > k + 1 or eq or _takes_no_value(name)):
                    break
                j += 1
            groups.append(ArgGroup(name, args[k:j]))
            k = j
            continue
        if _script_arguments(word):
            # "$@": whatever the script is given when it runs, passed on. Kept where it is
            # (the export's script passes them on too) and named in a warning line.
            groups.append(ArgGroup(None, (word,)))
            k += 1
            continue
        # An unknown word after a flag autotune knows (whose values are all taken) or before
        # any flag may hold flags; after an unknown flag it is taken for that flag's value.
        if text is None and (not groups or groups[-1].flag is None
                             or groups[-1].flag in known or len(groups[-1].words) > 1
                             or "=" in (groups[-1].words[0].text or "")
                             or _takes_no_value(groups[-1].flag)):
            raise ConfigError(f"{source}: {word.shown()} stands where flags go "
                              f"({word.refs[0].reason}); autotune cannot tell which flags it "
                              "holds: set it in the script before the command")
        if groups and groups[-1].flag is not None:
            groups[-1] = ArgGroup(groups[-1].flag, (*groups[-1].words, word))
        else:
            groups.append(ArgGroup(None, (word,)))
        k += 1
    return tuple(groups), _GivenWithRefs(values, unresolved, source, line)


def _script_arguments(word: Word) -> bool:
    """Whether `word` is the script's own arguments alone (`"$@"`, `$*`)."""
    return len(word.parts) == 1 and isinstance(word.parts[0], Ref) \
        and SCRIPT_ARGUMENTS.fullmatch(word.parts[0].text) is not None


def script_arguments_warning(command: MegatronCommand) -> str | None:
    """One line where the command passes on the script's own arguments ("$@"): autotune reads
    the script, not how it is called, so flags given on that call are not in the plan; the
    export keeps "$@" where it is (after the flags autotune adds, where it ends the command:
    autotune.megatron.script_patch), so such a flag still overrides. None where the command
    has none."""
    found = [w.shown() for g in command.groups if g.flag is None for w in g.words
             if _script_arguments(w)]
    if not found:
        return None
    return (f"{command.source}: line {command.line}: {found[0]} passes on the script's own "
            "arguments, which autotune cannot see: the plan is the command without them; the "
            "exported script passes them on where yours does, last where yours has them last "
            "(a flag among them overrides the same flag before it)")


class _GivenWithRefs(Given):
    """Given, refusing a flag autotune reads whose value the script does not set."""

    def __init__(self, values: dict[str, str | None], unresolved: dict[str, Ref],
                 source: str, line: int) -> None:
        super().__init__({**values, **{n: "" for n in unresolved}}, f"{source}: line {line}")
        self.unresolved = unresolved
        self.file = source
        self.line = line

    def text(self, name: str, default: str | None = None) -> str | None:
        ref = self.unresolved.get(name)
        if ref is not None:
            # The reason without its leading "TEXT: " (TEXT may hold ": " itself: ${1:?"x: y"}).
            why = ref.reason.removeprefix(f"{ref.text}: ")
            if ref.arithmetic and ref.line is not None and ref.line != self.line:
                # Set in a variable: the number is written where the arithmetic is.
                raise ConfigError(f"{self.file}: line {ref.line}: {ref.text} (the value of "
                                  f"{name} on line {self.line}): {why}; autotune needs its "
                                  "value: write the number there")
            fix = ": write the number there" if ref.arithmetic else ""
            raise ConfigError(f"{self.source}: {name} {ref.text}: {why}"
                              f"; autotune needs its value{fix}")
        return super().text(name, default)

    def integer(self, name: str, default: int | None = None) -> int | None:
        self.text(name)
        return super().integer(name, default)

    def number(self, name: str, default: float) -> float:
        self.text(name)
        return super().number(name, default)


def _refuse_unrepresented(groups: tuple[ArgGroup, ...], model: ModelSpec, source: str) -> None:
    """One line for the first flag of the command that gives the model a shape autotune's
    models do not have (megatron_args.UNREPRESENTED_FLAGS): predicting the model without it
    would be a figure for another model."""
    for group in groups:
        unrepresented = UNREPRESENTED_FLAGS.get(group.flag or "")
        if unrepresented is None:
            continue
        words = group.values
        shown = " ".join(w.shown() for w in group.words)
        if any(w is None for w in words):
            raise ConfigError(f"{source}: {shown}: autotune cannot tell this value, and "
                              f"{group.flag} may give the model {unrepresented.what}, which "
                              "autotune's models do not have: set it in the script before the "
                              "command")
        if not unrepresented.ours([w for w in words if w is not None], model):
            raise ConfigError(f"{source}: {shown} gives the model {unrepresented.what}, which "
                              "autotune's models do not have (its memory and step time would "
                              "be another model's)")


@cache
def _accepted_values() -> dict[str, dict[str, dict[str, Any]]]:
    """Per Megatron-LM release, what its parser accepts for each flag that says (int or float,
    choices, no value): flag_values.json, read from each release's arguments.py by
    tools/megatron_values.py."""
    text = resources.files("autotune.megatron").joinpath("flag_values.json").read_text()
    releases: dict[str, dict[str, dict[str, Any]]] = json.loads(text)["releases"]
    return releases


def _takes_no_value(flag: str) -> bool:
    """Whether Megatron-LM's parser gives `flag` no value (every release that declares it)."""
    told = [rec[flag] for rec in _accepted_values().values() if flag in rec]
    return bool(told) and all(r.get("takes_value") is False for r in told)


def _refusal(record: dict[str, Any], values: list[str]) -> str | None:
    """Why Megatron-LM's parser, as `record` describes a flag, refuses these values (None when
    it takes them)."""
    if record.get("takes_value") is False:
        return f"takes no value, got {values[0]!r}" if values else None
    kind = record.get("type")
    for value in values:
        if kind in ("int", "float"):
            try:
                int(value) if kind == "int" else float(value)
            except ValueError:
                return f"takes {'an integer' if kind == 'int' else 'a number'}, got {value!r}"
        choices = record.get("choices")
        if choices is not None and value not in choices:
            return f"takes one of {', '.join(choices)}; got {value!r}"
    return None


def _refuse_bad_values(groups: tuple[ArgGroup, ...], source: str) -> None:
    """One line for the first flag of the command whose value Megatron-LM's own parser would
    refuse (in every release whose arguments.py says what the flag takes): the command stops
    at its first line, and so would the export that carries it."""
    releases = _accepted_values()
    for group in groups:
        if group.flag is None:
            continue
        values = group.values
        if any(v is None for v in values):
            continue  # a value autotune cannot tell: carried as written
        told = {r: rec[group.flag] for r, rec in releases.items() if group.flag in rec}
        why = [_refusal(record, [v for v in values if v is not None])
               for record in told.values()]
        if told and all(why):
            shown = " ".join(w.shown() for w in group.words)
            raise ConfigError(f"{source}: {shown}: {group.flag} {why[-1]} (Megatron-LM's "
                              f"arguments.py, releases {', '.join(told)})")


def _model_name(path: Path) -> str:
    """A model name from the file's name: its stem, letters, digits, '.', '_', '-' only (the
    name titles reports and makes the default study name)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.")[:MODEL_NAME_MAX]
    return name or "megatron-command"


def read_megatron_command(path: str, line: int | None = None,
                          data: bytes | None = None) -> MegatronCommand:
    """The pretrain_gpt.py command of the file at `path` (the one on `line`, when given), read
    (never run); `data`: the file's text as given, not read from `path` (the export's patched
    script, read back before it is written)."""
    file = Path(path)
    if line is not None and line < 1:
        raise ConfigError(f"--line must be a positive line number, got {line}")
    raw = read_script(path) if data is None else data
    parsed = parse_script(raw, path)
    command, site = _find(parsed, line)
    at = next(k for k, w in enumerate(command.words) if _is_script(w))
    # `srun ... sh -c "python pretrain_gpt.py ..."`: srun and its options launch the string's
    # python, as they would launch it written without the shell.
    launcher, script = (*command.wrapper, *command.words[:at]), command.words[at]
    if script.text is None:
        # The script's path may come from the environment ($MEGATRON_LM/pretrain_gpt.py):
        # autotune never runs it, and the export carries it as "${NAME}".
        pass
    groups, given = _group(command.words[at + 1:], path, command.line)
    try:
        read = read_fields(given)
    except MissingFlagError as exc:
        # Only a flag the command lacks may come from the script's own arguments; a value the
        # command gives wrong is wrong whatever "$@" holds.
        passed_on = [w.shown() for g in groups if g.flag is None for w in g.words
                     if _script_arguments(w)]
        if not passed_on:
            raise
        # Not a guess at what the script is called with: the flag goes in the script.
        raise MissingFlagError(f"{exc}; the script's own arguments ({passed_on[0]}), which "
                               "autotune cannot see, may give it: write it in the script",
                               exc.flag) from None
    names = {f.name for f in fields(ModelSpec)}
    model = ModelSpec(name=_model_name(file), **{k: v for k, v in read.items() if k in names})
    _refuse_unrepresented(groups, model, path)
    _refuse_bad_values(groups, path)
    layout_fields = {k: v for k, v in read.items() if k in DIMENSIONS}
    if PIPELINE_LAYOUT in read:
        # The layout string's split, in place of the split flags' defaults read above (Megatron
        # refuses the two together: the reading refused them).
        layout_fields.update(split_fields(read[PIPELINE_LAYOUT], model,
                                          f"{path}: line {command.line}"))
    # The levers set in the run's environment (the allocator's), as the script exports them
    # and the command's own `NAME=value` prefixes override them; a value the script takes from
    # its caller's environment is not known here and reads as unset.
    layout_fields.update(environment_fields(_script_environment(command.exported, command.env)))
    per_node, nodes, why, launcher_env, nnodes_env = _launcher_gpus(launcher, path)
    sbatch = _sbatch(command, raw.decode("utf-8", errors="replace"))
    sbatch_nodes = _sbatch_nodes(nnodes_env, sbatch) if why is None else None
    if sbatch_nodes is not None:
        nodes = sbatch_nodes
    slurm = _srun_gpus(launcher, sbatch)
    if slurm is not None:
        per_node, nodes, why = slurm.per_node, slurm.nodes, slurm.why
    return MegatronCommand(source=path, line=command.line, env=command.env,
                           exported=command.exported, launcher=launcher, script=script,
                           groups=groups, model=model, layout_fields=layout_fields,
                           gpus_per_node=per_node, nodes=nodes, gpus_unknown=why,
                           parsed=parsed, site=site, maybe=command.maybe,
                           launcher_env=launcher_env, sbatch_nodes=sbatch_nodes,
                           sbatch_nodes_from=_nodes_from(command),
                           job_script=command.job is not None,
                           submit_defaults=tuple(sorted(command.job.submit_defaults))
                           if command.job is not None else (),
                           slurm_source=_slurm_source(command, slurm))


def _script_environment(exported: Iterable[tuple[str, Word]],
                        prefix: Iterable[tuple[str, Word]]) -> dict[str, str]:
    """The variables a script exported before its launch command, then the command's own
    `NAME=value` prefixes over them, with their values where the script spells them (one it
    takes from its caller's environment is unknown here and left out)."""
    return {name: word.text for name, word in (*exported, *prefix) if word.text is not None}


def megatron_layout(command: MegatronCommand, gpus: int) -> Layout:
    """The command's layout on `gpus` GPUs (dp follows from them), not yet validated."""
    values = command.layout_fields
    dp = derive_dp(gpus, tp=values.get("tp", 1), pp=values.get("pp", 1), cp=values.get("cp", 1))
    return Layout(dp=dp, **values)


ENV_ROW = "environment "
"""RowChange.row's prefix for a variable of the run's environment (autotune.megatron.environment)
rather than a row of the flag table."""


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row of the flag table whose arguments differ between two layouts."""

    row: str
    before: tuple[str, ...]
    after: tuple[str, ...]

    @property
    def variable(self) -> str | None:
        """The environment variable the change sets (ENV_ROW), or None for flags."""
        return self.row.removeprefix(ENV_ROW) if self.row.startswith(ENV_ROW) else None

    def describe(self) -> str:
        """The flags whose value changes (`--micro-batch-size 4 -> 8`), then those added and
        removed; a flag of the row that keeps its value is left out: a row groups flags (the
        batch's two sizes), and `--global-batch-size 256 -> 256` reads as a change."""
        if self.variable is not None:
            return (f"{self.variable}={self.before[0] if self.before else '(unset)'} -> "
                    f"{self.variable}={self.after[0]}")
        before, after = flag_values(self.before), flag_values(self.after)
        changed = [f"{' '.join([flag, *before[flag]])} -> {' '.join(values) or '(no value)'}"
                   for flag, values in after.items()
                   if flag in before and before[flag] != values]
        added = [" ".join([flag, *values]) for flag, values in after.items() if flag not in before]
        removed = [" ".join([flag, *values]) for flag, values in before.items()
                   if flag not in after]
        parts = [*changed, *([f"(none) -> {' '.join(added)}"] if added else []),
                 *([f"{' '.join(removed)} -> (removed)"] if removed else [])]
        return "; ".join(parts)


def flag_values(args: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """Each flag of a row's arguments with the values that follow it, in order."""
    out: dict[str, list[str]] = {}
    current = ""
    for arg in args:
        if arg.startswith("--"):
            out[arg] = []
            current = arg
        else:
            out[current].append(arg)
    return out


def layout_changes(command: MegatronCommand, old: Layout, new: Layout) -> list[RowChange]:
    """The rows of the flag table whose arguments differ between `old` (the command's layout)
    and `new`, as Megatron-LM runs them (impl sdpa as te)."""
    model = command.model
    old, new = exported_layout(old), exported_layout(new)
    given = {g.flag for g in command.groups}
    held = command.layout_string
    changes: list[RowChange] = []
    for row in FLAG_TABLE:
        if row.part != Part.LAYOUT:
            continue
        if held is not None and row.name == PIPELINE_LAYOUT:
            # The user's layout string stays their way of saying the split: rewritten for the
            # new layout where it gives other stages (pipeline_layout.format_layout), kept as
            # written where it does not.
            text = format_layout(model, new)
            if text != format_layout(model, old):
                changes.append(RowChange(row.name, (LAYOUT_FLAG, held), (LAYOUT_FLAG, text)))
            continue
        if held is not None and any(f.name in CONFLICTS for f in row.flags):
            continue  # the string says them; Megatron-LM refuses them beside it
        before, after = row_args(row, model, old), row_args(row, model, new)
        if row.name == "sequence_parallel" and "--sequence-parallel" in given \
                and not new.sequence_parallel and new.tp > 1:
            # Megatron-LM ignores the file's --sequence-parallel at tp 1 (validate_args turns
            # it off; the command's layout reads without it), but at the new layout's tp it
            # would turn sequence parallelism on: it goes.
            before = ["--sequence-parallel"]
        if before != after:
            changes.append(RowChange(row.name, tuple(before), tuple(after)))
    # The run's environment (the allocator's option): the option the new layout needs appended
    # to what the script holds, where the two give different fields (the last option holds).
    env = _script_environment(command.exported, command.env)
    for name, option in run_environment(new).items():
        held = env.get(name)
        if environment_fields({name: held or ""}) != environment_fields({name: option}):
            changes.append(RowChange(f"{ENV_ROW}{name}", () if held is None else (held,),
                                     (f"{held},{option}" if held else option,)))
    return changes
