"""Value types with their ranges, for the fields of what inputs become (ModelSpec, TrialMetrics).

Each is `Annotated[base, constraints...]` with annotated_types' constraints: to mypy and to the
code the plain base type, to pydantic (autotune.inputs.schema) the rule a file's value must
follow. Strictness (a string is not a number, "false" is not a bool) is schema's, for every
field alike.
"""

from __future__ import annotations

from typing import Annotated

import annotated_types as at

__all__ = ["BYTES_MAX", "COUNT_MAX", "FLOAT_MAX", "PARAMETERS_MAX", "SECONDS_MAX", "VOCAB_MIN",
           "Bytes", "Count", "Fraction", "NonNegative", "NonNegativeInt", "Positive", "Text",
           "Vocabulary"]

COUNT_MAX = 2**40
"""The largest count read (layers, heads, vocabulary, tokens, GPUs): far above any real model,
far below what overflows the arithmetic that follows (1e300 is refused here)."""
PARAMETERS_MAX = 10**14
"""The most parameters a model read may have: 100 times the largest preset (gpt-1t). Each count
within COUNT_MAX can still make a model of 1e20 parameters and more (10**12 layers), whose plan
is figures of 1e18 GiB per GPU and 0 tokens/s: refused instead (autotune.specs.model)."""
BYTES_MAX = 2**60
"""The largest byte figure read (an exabyte): a GPU's memory is under 2**38."""
FLOAT_MAX = 1e18
"""The largest real number read (a tokens/s, a FLOP/s figure per GPU is under 1e16)."""
SECONDS_MAX = 1e9
"""The longest duration read (--time-budget, --trial-timeout): about 32 years, under what a
thread's wait takes (threading.TIMEOUT_MAX; a longer wait raises OverflowError)."""

Count = Annotated[int, at.Gt(0), at.Le(COUNT_MAX)]
"""A positive integer: layers, heads, widths, sizes."""
VOCAB_MIN = 2
"""The smallest vocabulary a model may have. With one token every label is that token: the
softmax of a single logit is 1, the loss 0 and every gradient 0, so nothing trains (and no
tokenizer has one: byte-level ones have 256, DNA models a dozen)."""
Vocabulary = Annotated[int, at.Ge(VOCAB_MIN), at.Le(COUNT_MAX)]
"""A vocabulary's size in tokens."""
NonNegativeInt = Annotated[int, at.Ge(0), at.Le(COUNT_MAX)]
"""An integer that may be zero: layers given to a stage, a rank."""
Bytes = Annotated[int, at.Ge(0), at.Le(BYTES_MAX)]
"""A measured memory figure in bytes."""
Positive = Annotated[float, at.Gt(0), at.Le(FLOAT_MAX)]
"""A positive real: a step time, a throughput, a base frequency."""
NonNegative = Annotated[float, at.Ge(0), at.Le(FLOAT_MAX)]
"""A real that may be zero: a duration, an overhead."""
Fraction = Annotated[float, at.Ge(0), at.Le(1)]
"""A probability or a share: dropout, MFU, an efficiency."""
Text = Annotated[str, at.MaxLen(100_000)]
"""Free text read back (an error excerpt, a reason): bounded, shown through
autotune.inputs.untrusted."""
