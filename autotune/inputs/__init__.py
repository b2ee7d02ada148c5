"""Where untrusted input enters autotune, checked once per kind (docs/ARCHITECTURE.md, "Where
inputs are checked"):

- `files`: a file the user named, read as text: regular files only (never /dev/zero, a FIFO or
  a device), at most a size limit, UTF-8.
- `documents`: that text parsed as YAML or JSON with bounded work: no YAML aliases (an anchor
  bomb), a nesting depth limit (no RecursionError).
- `bounds`: the value types the dataclasses that inputs become declare (`Count`, `Fraction`,
  ...): a type with its range, as annotated_types constraints that pydantic enforces.
- `schema`: a parsed mapping checked against such a dataclass with pydantic (types, finiteness,
  ranges, unknown and missing fields), every problem one line naming the file and the field.
- `numbers`: numbers that enter as text, not through a schema (a count typed on the command
  line, a Megatron-LM flag's value in a script): within the same bounds.
- `untrusted`: text from a file or a study on its way out: control characters stripped for the
  terminal, escaped for Markdown and HTML.

Only `schema` imports pydantic, and only when a file is checked: `autotune --help` stays fast.
"""
