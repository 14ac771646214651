"""Small formatting pieces shared by the renderers: numbers, sparklines, step selection."""

import math

BARS = "▁▂▃▄▅▆▇█"


def fmt(value):
    """A number for a table cell: 4 significant digits, nan/inf spelled out, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def sparkline(values, width=60):
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


def _bucket_max(values):
    if any(v is None or not math.isfinite(v) for v in values):
        return math.nan
    return max(values, key=abs)


def selected_steps(records, first_nonfinite_step, head=3, middle=6):
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


def hanging(marker, text, style=None):
    """`marker` then `text`, whose wrapped lines line up under its first word, not flush left.

    Example: hanging("   - ", "a long evidence line ...") prints
        "   - a long evidence line that goes on"
        "     and wraps here"
    """
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid()
    text = Text(text) if isinstance(text, str) else text  # evidence is plain text: "[x]" is not Rich markup
    marker = Text(marker)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(marker, text, style=style)
    return grid
