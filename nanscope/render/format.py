"""Small formatting pieces shared by the renderers: numbers, sparklines, step selection."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from nanscope.jsonio import encode_float

if TYPE_CHECKING:
    from rich.console import Console
    from rich.style import Style
    from rich.table import Table
    from rich.text import Text



class _Stepped(Protocol):
    step: int


Record = TypeVar("Record", bound=_Stepped)

BARS = "▁▂▃▄▅▆▇█"


def fmt(value: float | str | None) -> str:
    """A number for a table cell: 4 significant digits, nan/inf spelled out, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(encode_float(value))  # the JSON's spelling: nan, inf, -inf
    return f"{value:.4g}"


def sparkline(values: Sequence[float | None], width: int = 60) -> str:
    """Unicode sparkline of |values| on a log scale, resampled to `width`; non-finite points drawn as x."""
    if not values:
        return ""
    if len(values) > width:
        bucket = len(values) / width
        values = [_bucket_max(values[int(i * bucket):int((i + 1) * bucket)]) for i in range(width)]
    finite = [math.log10(abs(v) + 1e-30) for v in values if v is not None and math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    span = (high - low) or 1.0
    chars = []
    for v in values:
        if v is None or not math.isfinite(v):
            chars.append("x")
        else:
            level = (math.log10(abs(v) + 1e-30) - low) / span
            chars.append(BARS[min(len(BARS) - 1, int(level * (len(BARS) - 1) + 0.5))])
    return "".join(chars)


def _bucket_max(values: Sequence[float | None]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < len(values):
        return math.nan
    return max(finite, key=abs)


def selected_steps(records: Sequence[Record], first_nonfinite_step: int | None, head: int = 3,
                   middle: int = 6) -> list[Record]:
    """A few records to show as rows: the first steps, evenly spaced ones, the last healthy and the first non-finite."""
    if len(records) <= head + middle + 2:
        return list(records)
    picks = set(range(head))
    stride = max(1, len(records) // (middle + 1))
    picks.update(range(stride, len(records), stride))
    picks.add(len(records) - 1)
    if first_nonfinite_step is not None:
        index = next((i for i, r in enumerate(records) if r.step == first_nonfinite_step), None)
        if index is not None:
            picks.update({index, max(0, index - 1)})
    return [records[i] for i in sorted(picks)]


def hanging(marker: str, text: str | Text, style: str | Style | None = None) -> Table:
    """`marker` then `text`, whose wrapped lines line up under its first word, not flush left.

    Example: hanging("   - ", "a long evidence line ...") prints
        "   - a long evidence line that goes on"
        "     and wraps here"
    """
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid()
    cell = Text(text) if isinstance(text, str) else text  # evidence is plain text: "[x]" is not Rich markup
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(Text(marker), cell, style=style)
    return grid


# Where an identifier (a layer, variable, column or fix name) may break across lines: after these.
NAME_BREAKS = "_./-=, "
# The narrowest a name column is squeezed to before the table is let run wide.
NAME_MIN_WIDTH = 8


def name_lines(name: object, width: int) -> str:
    """`name` broken into lines of at most `width` characters, only after _ . / - = , or a space (or before a
    `[`), so that "tenure_months" becomes "tenure_" / "months", never "tenure_mont" / "hs". A part with no
    break in `width` characters is split at `width`, the one case a word is cut.
    """
    name = str(name)
    if len(name) <= width:
        return name
    parts, start = [], 0
    for i, char in enumerate(name):
        if char in NAME_BREAKS or (char == "[" and i > start):
            end = i + 1 if char != "[" else i
            parts.append(name[start:end])
            start = end
    parts.append(name[start:])
    lines, line = [], ""
    for part in parts:
        while len(part) > width:  # no break in `width` characters
            if line:
                lines.append(line)
                line = ""
            lines.append(part[:width])
            part = part[width:]
        if len(line) + len(part) > width:
            lines.append(line)
            line = part
        else:
            line += part
    lines.append(line)
    return "\n".join(line.rstrip() for line in lines if line.strip())


def header(text: str) -> str:
    """A column header with one word per line, for a column of numbers that never wraps (its header cannot)."""
    return "\n".join(text.split(" "))


def compact_table(title: str | None = None) -> Table:
    """A table for 80 columns: a rule under the header, two spaces between columns, no outer edge."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)


def fitted(build: Callable[[Callable[[Any], str]], Table], names: Iterable[object], console: Console,
           width: int | None = None) -> Table:
    """The table `build(wrap)` makes, where `wrap(name)` breaks the name cells at the widest width at which the
    whole table fits `width` (default: the console's) without cutting a cell; at NAME_MIN_WIDTH if none does.

    Names and other identifiers are the only cells that give way: numbers never wrap and prose columns wrap
    at spaces, so a table that fits this way shows every number whole.
    """
    width = width or console.width
    longest = max((len(str(n)) for n in names), default=NAME_MIN_WIDTH)
    for name_width in range(max(longest, NAME_MIN_WIDTH), NAME_MIN_WIDTH - 1, -1):
        table = build(functools.partial(name_lines, width=name_width))
        if _narrowest(table, console) <= width:
            return table
    return table


def _narrowest(table: Table, console: Console) -> int:
    """The fewest columns `table` can take without cutting a cell: a column that does not wrap needs its
    widest line, one that wraps its longest word. (Rich measures both by the longest word and, when the
    sum does not fit, cuts every column alike.)"""
    from rich.measure import Measurement

    options = console.options.update_width(10 ** 4)
    natural, narrowest = Measurement.get(console, options, table).maximum, 0
    for column in table.columns:
        sizes = [Measurement.get(console, options, cell) for cell in (column.header, *column.cells)]
        widest = max(size.maximum for size in sizes)
        natural -= widest  # what is left is the padding and the rules between columns
        narrowest += widest if column.no_wrap else max(max(size.minimum for size in sizes), column.min_width or 0)
    return narrowest + natural
