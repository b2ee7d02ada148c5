"""Numbers that enter as text rather than through a file's schema: a count typed on the command
line (`--gpus`, `--seq-len`, `--global-batch-size`, ...) and a value of a Megatron-LM flag in a
`--from-megatron` script. They keep the bounds a file's values have (autotune.inputs.bounds):
a count past COUNT_MAX is refused where it enters, not turned into an OverflowError by the
float arithmetic of the models that follow (a batch of 10**400 sequences cannot be a float).
"""

from __future__ import annotations

import math

from autotune.errors import ConfigError
from autotune.inputs.bounds import COUNT_MAX, FLOAT_MAX, SECONDS_MAX
from autotune.inputs.untrusted import shown

__all__ = ["check_count", "check_seconds", "integer_text", "number_text"]


def check_count(option: str, value: int | None) -> None:
    """An option's count (None: not given), or ConfigError: `--gpus must be a positive
    integer, got 0`."""
    if value is None:
        return
    if value <= 0:
        raise ConfigError(f"{option} must be a positive integer, got {shown(value)}")
    if value > COUNT_MAX:
        raise ConfigError(f"{option} must be at most {COUNT_MAX:,} (2**40), got "
                          f"{shown(value)}")


def check_seconds(option: str, value: float | None, *, absent: str) -> None:
    """An option's duration in seconds (None: not given), or ConfigError: `--time-budget must
    be a positive number of seconds (leave it out for no limit), got inf`: inf, NaN,
    0 and negatives alike, none a duration; `absent` says what leaving the option out means."""
    if value is None:
        return
    if not (math.isfinite(value) and value > 0):
        hint = f" (leave it out for {absent})" if value == math.inf else ""
        raise ConfigError(f"{option} must be a positive number of seconds{hint}, got "
                          f"{value:g}")
    if value > SECONDS_MAX:
        raise ConfigError(f"{option} must be at most {SECONDS_MAX:g} seconds, got {value:g}")


def integer_text(text: str, what: str) -> int:
    """`text` as an integer of at most COUNT_MAX in size, or ConfigError naming `what`
    (`run.sh: line 12: --seq-length`)."""
    try:
        value = int(text)
    except ValueError:  # not an integer, or more digits than Python converts (4300)
        raise ConfigError(f"{what} {shown(text)} is not an integer") from None
    if abs(value) > COUNT_MAX:
        raise ConfigError(f"{what} {shown(text)} is larger than any count autotune reads "
                          f"({COUNT_MAX:,})")
    return value


def number_text(text: str, what: str) -> float:
    """`text` as a finite real of at most FLOAT_MAX in size, or ConfigError naming `what`."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what} {shown(text)} is not a number") from None
    if not math.isfinite(value) or abs(value) > FLOAT_MAX:
        raise ConfigError(f"{what} {shown(text)} is not a finite number of at most "
                          f"{FLOAT_MAX:g}")
    return value
