"""Megatron-LM's `--moe-layer-freq`: an integer, or a Python list expression of 0 (dense) and 1
(MoE) per layer such as `([0]*3+[1]*58)`, which Megatron-LM evaluates with eval() after a
character check (core_v0.16.1 arguments.py moe_freq_type, _eval_pattern). autotune never
evaluates what a user wrote: it parses the list, repetition and concatenation forms those
characters allow, and writes a list back in the same form.
"""

from __future__ import annotations

from autotune.errors import ConfigError

__all__ = ["format_layer_freq", "parse_layer_freq"]

_Value = int | list[int]


class _Parser:
    """expr := term ('+' term)*; term := atom ('*' atom)*; atom := INT | '[' INT (',' INT)*
    ']' | '(' expr ')': Python's list and int arithmetic over those characters."""

    def __init__(self, text: str, source: str) -> None:
        self.text, self.source, self.at = text.replace(" ", ""), source, 0

    def fail(self, why: str) -> ConfigError:
        return ConfigError(f"{self.source}: --moe-layer-freq {self.text!r}: {why}")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def take(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"expected {char!r} at character {self.at + 1}")
        self.at += 1

    def integer(self) -> int:
        start = self.at
        while self.peek().isdigit():
            self.at += 1
        if start == self.at:
            raise self.fail(f"expected a number at character {start + 1}")
        if self.at - start > 6:
            raise self.fail("a number too large for a layer pattern")
        return int(self.text[start:self.at])

    def atom(self) -> _Value:
        if self.peek() == "[":
            self.take("[")
            items = [self.integer()]
            while self.peek() == ",":
                self.take(",")
                items.append(self.integer())
            self.take("]")
            return items
        if self.peek() == "(":
            self.take("(")
            value = self.expr()
            self.take(")")
            return value
        return self.integer()

    def term(self) -> _Value:
        value = self.atom()
        while self.peek() == "*":
            self.take("*")
            other = self.atom()
            if isinstance(value, list) and isinstance(other, list):
                raise self.fail("a list times a list")
            if isinstance(value, list) or isinstance(other, list):
                items, times = (value, other) if isinstance(value, list) else (other, value)
                assert isinstance(items, list) and isinstance(times, int)
                if len(items) * times > 1_000_000:
                    raise self.fail("more layers than any model has")
                value = items * times
            else:
                assert isinstance(other, int)
                value = value * other
        return value

    def expr(self) -> _Value:
        value = self.term()
        while self.peek() == "+":
            self.take("+")
            other = self.term()
            if isinstance(value, list) != isinstance(other, list):
                raise self.fail("a list plus a number")
            value = value + other  # type: ignore[operator]
        return value


def parse_layer_freq(text: str, source: str) -> int | tuple[int, ...]:
    """The value of `--moe-layer-freq TEXT`: an int, or a tuple of 0 and 1 per layer."""
    if text.strip().isdigit():
        return int(text)
    parser = _Parser(text, source)
    value = parser.expr()
    if parser.at != len(parser.text):
        raise parser.fail(f"unexpected {parser.peek()!r} at character {parser.at + 1} (autotune "
                          "reads an integer or a list expression of [..], *, + and ( ))")
    if isinstance(value, int):
        return value
    if any(v not in (0, 1) for v in value):
        raise parser.fail("a pattern gives 0 (dense) or 1 (MoE) per layer")
    return tuple(value)


def format_layer_freq(freq: int | tuple[int, ...]) -> str:
    """`freq` as --moe-layer-freq's value: the integer, or the list as runs, `[0]*3+[1]*58`."""
    if isinstance(freq, int):
        return str(freq)
    runs: list[tuple[int, int]] = []
    for v in freq:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return "+".join(f"[{v}]*{n}" if n > 1 else f"[{v}]" for v, n in runs)
