"""Text autotune did not write (a model name, a config string, a worker's error excerpt) on its
way out: to the terminal, into report.md, into an HTML or PNG plot. One function per exit, so
every exit of one kind treats such text alike."""

from __future__ import annotations

import html
import re

__all__ = ["for_html", "for_markdown", "for_matplotlib", "for_terminal", "shown"]

_ESCAPE_SEQUENCE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-_])")
"""ANSI/VT escape sequences: CSI (colours, cursor moves), OSC (window titles, hyperlinks,
ended by BEL or ST) and the two-character ones."""
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+!|~])")
"""Characters with a meaning in (GitHub-flavoured) Markdown, escaped with a backslash."""


def for_terminal(text: str) -> str:
    """`text` with escape sequences removed and every other control or format character
    (newline, carriage return, bidi overrides) written as its escape (`\\n`, `\\u202e`): one
    line that shows what the text holds and cannot move the cursor or recolour the terminal."""
    text = _ESCAPE_SEQUENCE.sub("", text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def shown(value: object, limit: int = 60) -> str:
    """A value for a one-line message: repr (strings quoted, escapes for control characters),
    cut after `limit` characters."""
    text = repr(value)
    return for_terminal(text if len(text) <= limit else text[:limit] + "...")


def for_markdown(text: str) -> str:
    """`text` as literal Markdown: one line (for_terminal), HTML's `<`, `>` and `&` as entities
    (Markdown passes raw HTML through, `<script>` included), Markdown's own syntax escaped."""
    return _MARKDOWN.sub(r"\\\1", html.escape(for_terminal(text), quote=False))


def for_html(text: str) -> str:
    """`text` as literal HTML text or attribute value (plotly titles and hover labels)."""
    return html.escape(for_terminal(text), quote=True)


def for_matplotlib(text: str) -> str:
    """`text` as a literal matplotlib label: one line, `$` escaped (it starts mathtext, whose
    parser raises on what it cannot read)."""
    return for_terminal(text).replace("$", r"\$")
