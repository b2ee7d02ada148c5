"""The top layouts of a search's `--json` answer as LAYOUT texts for tools/repeatability.py.

    python3 tools/finalist_fields.py SEARCH.json [N]     (N: how many, default 2)

Prints one `field=value,...` text per line, best first, each layout once, with the fields that
differ from Layout's defaults (what tools/device_layouts.py's layout_fields reads back). Issue
25's "a search shown deciding correctly": the search's two best are measured again, warm and
cold, over several rounds, and their order compared with the search's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from autotune.layouts.layout import DIMENSIONS, Layout


def layout_text(row: dict[str, Any]) -> str:
    """A search's best row as `field=value,...`: the fields that differ from the defaults."""
    default = Layout()
    items = []
    for name in DIMENSIONS:
        value = row.get(name)
        if value is None or value == getattr(default, name):
            continue
        items.append(f"{name}={value}")
    return ",".join(items)


def top_layouts(answer: dict[str, Any], n: int) -> list[str]:
    """The first `n` distinct layouts of the answer's best rows."""
    texts: list[str] = []
    for row in answer.get("best", []):
        text = layout_text(row)
        if text not in texts:
            texts.append(text)
        if len(texts) == n:
            break
    return texts


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__.split("\n\n")[1].strip())
    text = Path(sys.argv[1]).read_text()
    answer = json.loads(text[text.index("{"):])  # log lines may come before the JSON
    for line in top_layouts(answer, int(sys.argv[2]) if len(sys.argv) == 3 else 2):
        print(line)


if __name__ == "__main__":
    main()
