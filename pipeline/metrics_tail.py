"""Reading the metrics store from its end: the newest lines, and what was appended since.

The store's streams are append-only day files (pipeline/metrics.py), so the newest rows are
the last lines of the newest files. Readers that show a window or keep running totals read
only those bytes, never the whole history (DESIGN.md §6):

- :func:`tail_lines`: the newest ``n`` complete lines of a stream, read backwards in blocks
  (the console's "newest batches" views, app/sources.py).
- :class:`StreamTail`: a cursor over a stream that returns the rows appended since its last
  call (the state census, the exporter's running totals).

A line is complete once its newline is written; the half-written line the job may be
appending is left for the next read. Both are safe while the job writes and while the
retention removes old day files, and neither holds a file open between calls.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import store

BLOCK_BYTES = 64 * 1024


def day_files(data_dir: Path, stream: str) -> list[Path]:
    """The day files of a stream, oldest first (``<YYYY-MM-DD>.jsonl``)."""
    folder = store.metrics_dir(data_dir, stream)
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def _last_lines(path: Path, wanted: int) -> tuple[list[bytes], int]:
    """Up to ``wanted`` of the last complete lines of one file, oldest first, and the byte
    offset the first of them starts at (with none: where the next complete line will start)."""
    with open(path, "rb") as handle:
        end = handle.seek(0, 2)  # bytes appended after this are the next read's
        position, buffer, block = end, b"", BLOCK_BYTES
        while position > 0 and buffer.count(b"\n") <= wanted:
            step = min(block, position)
            position -= step
            handle.seek(position)
            buffer = handle.read(step) + buffer
            block *= 2
    complete = buffer[: buffer.rfind(b"\n") + 1]  # a half-written last line is the next read's
    pieces = complete.split(b"\n")[:-1]
    start = position
    if position > 0 and pieces:  # the first piece may begin before the block read: not a whole line
        start += len(pieces[0]) + 1
        pieces = pieces[1:]
    if wanted <= 0 or not pieces:
        return [], position + len(complete)
    kept = pieces[-wanted:]
    start += sum(len(piece) + 1 for piece in pieces[: len(pieces) - len(kept)])
    return kept, start


def tail_lines(data_dir: Path, stream: str, n: int) -> tuple[list[bytes], bool]:
    """The newest ``n`` complete lines of a stream (fewer if it holds fewer), oldest first, and
    whether they are the whole stream. Reads blocks from the end of the newest day files only."""
    lines: list[bytes] = []
    for path in reversed(day_files(data_dir, stream)):
        if len(lines) > n:
            break
        try:
            found, _ = _last_lines(path, n + 1 - len(lines))  # one more: is there anything older?
        except FileNotFoundError:  # removed by the retention meanwhile: older than anything shown
            break
        lines = found + lines
    return (lines[-n:] if n > 0 else []), len(lines) <= n


def parse_lines(lines: list[bytes]) -> list[dict]:
    """The rows of complete lines; a line that is not a JSON object is skipped."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class StreamTail:
    """The rows appended to one metrics stream since the last :meth:`read_new`.

    ``newest`` chooses where the first read starts: None = the oldest retained row (a running
    total over the whole retained store, read once), ``n`` = the newest ``n`` rows. Afterwards
    each read parses only the bytes appended since. It follows the day files as the job opens
    new ones, and reads to the end of the previous day's file too, for a row the job wrote there
    late. Not thread-safe: one reader per tail.
    """

    def __init__(self, data_dir: Path, stream: str, newest: int | None = None):
        self.data_dir, self.stream = Path(data_dir), stream
        self._offsets: dict[str, int] = {}  # day file name -> bytes consumed
        self._open_from = ""  # the oldest day file still read; older ones are done
        self._started = False
        self._newest = newest

    def _start(self) -> None:
        self._started = True
        files = day_files(self.data_dir, self.stream)
        if self._newest is None or not files:
            return
        remaining = self._newest
        for path in reversed(files):  # each file from where its share of the newest lines starts
            try:
                found, start = _last_lines(path, remaining)
            except FileNotFoundError:
                break
            self._offsets[path.name], self._open_from = start, path.name
            remaining -= len(found)
            if remaining <= 0:
                break

    def read_new(self) -> list[dict]:
        """The complete rows appended since the last call (the first call: see the class docstring)."""
        return parse_lines(self.read_new_lines())

    def read_new_lines(self) -> list[bytes]:
        """The complete lines appended since the last call, unparsed (for a reader that needs
        one field of each row and can find it without parsing the whole line)."""
        if not self._started:
            self._start()
        files = day_files(self.data_dir, self.stream)
        lines: list[bytes] = []
        for path in files:
            if path.name < self._open_from:
                continue
            offset = self._offsets.get(path.name, 0)
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:  # removed by the retention meanwhile
                continue
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path.name] = offset + len(complete)
            lines.extend(line for line in complete.split(b"\n") if line.strip())
        # From now on only the newest two files can still grow (a row the job wrote late for
        # the previous day); older ones are done, and the retention removes them.
        if len(files) >= 2:
            self._open_from = max(self._open_from, files[-2].name)
        self._offsets = {name: offset for name, offset in self._offsets.items() if name >= self._open_from}
        return lines
