"""Which rows check-data reads: the stream cut into chunks of a few MB, and a uniform (seeded) sample of them."""

from collections.abc import Iterator

import numpy as np

from nanscope.checkdata.stream import Chunk, DataStream
from nanscope.errors import DataError

CHUNK_BYTES = 4 << 20
STREAM_CHUNK_ROWS = 16384


def sampled_chunks(stream: DataStream, sampler: "Sampler", chunk_rows: int | None
                   ) -> Iterator[tuple[Chunk, np.ndarray, int, int]]:
    """(chunk, its sampled rows, its first row, the row after it) for each chunk the sampler still wants."""
    rows = 0
    for chunk in stream.chunks(chunk_rows or default_chunk_rows(stream)):
        n = chunk_length(chunk, stream)
        chosen = sampler.rows(rows, n)
        if chosen is None:
            return
        yield chunk, chosen, rows, rows + n
        rows += n


def default_chunk_rows(stream: DataStream) -> int:
    """Rows per chunk: about CHUNK_BYTES of them, or STREAM_CHUNK_ROWS when a row's size is not known."""
    if not stream.row_bytes:
        return STREAM_CHUNK_ROWS
    return max(1, CHUNK_BYTES // stream.row_bytes)


def chunk_length(chunk: Chunk, stream: DataStream) -> int:
    """Rows in one chunk; x and y of another length in the same chunk are bad data."""
    lengths = {name: len(a) for name, a in chunk.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise DataError(f"{stream.origin}: {stream.field}: x and y rows differ in one chunk: {listed}")
    return next(iter(lengths.values()), 0)


class Sampler:
    """Which rows of each chunk to scan: all, a uniform sample (length known), or the first N."""

    def __init__(self, sample: int | None, total: int | None) -> None:
        self.active = sample is not None and (total is None or sample < total)
        self.scanned = 0
        self.limit = sample or 0  # read only when active, that is with a sample size
        self.picks: np.ndarray | None = None
        if self.active and total is not None:
            self.picks = np.sort(np.random.default_rng(0).choice(total, size=sample, replace=False))

    def rows(self, start: int, n: int) -> np.ndarray | None:
        """The data rows to scan in [start, start + n), or None to stop reading."""
        if not self.active:
            return np.arange(start, start + n)
        if self.picks is None:
            if self.scanned >= self.limit:
                return None
            take = min(n, self.limit - self.scanned)
            self.scanned += take
            return np.arange(start, start + take)
        lo, hi = np.searchsorted(self.picks, [start, start + n])
        self.scanned += hi - lo
        return self.picks[lo:hi]
