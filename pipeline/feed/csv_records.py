"""Reading wire records from CSV files: every row typed and validated, or named as bad by line.

The header holds wire field names (:mod:`pipeline.wire`) in any order; columns that are not
fields are ignored, like extra JSON fields. A cell is text; it is typed by its field (an empty
optional cell takes the field's default) and the record is then checked by
:func:`pipeline.wire.parse_record`, the same check the job applies, so no half-formed record
is ever handed on. A bad row becomes one line such as
``orders.csv line 17: field 'userId' must be an integer, got 'abc'``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from pipeline.errors import InputDataError
from pipeline.wire import FIELDS, BadMessage, Field, parse_record

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class CsvRow:
    """One data row: the typed record, or the one-line error that says why there is none."""

    line: int  # where the row ends in the file; the header is line 1
    record: dict[str, Any] | None
    error: str | None


def convert_cell(field: Field, text: str) -> Any:
    """The typed value of one cell, or None for an empty optional cell (the field's default)."""
    if field.kind is str:
        return text
    value = text.strip()
    if not value:
        if field.required:
            raise BadMessage(f"field {field.name!r} is empty; it is required")
        return None
    if field.kind is int:
        try:
            if "_" not in value:  # int() would take "1_000"; a CSV of ids should not
                return int(value)
        except ValueError:
            pass
        raise BadMessage(f"field {field.name!r} must be an integer, got {text!r}")
    if not _NUMBER.match(value):
        raise BadMessage(f"field {field.name!r} must be a number, got {text!r}")
    return float(value)


def convert_row(kind: str, header: list[str], cells: list[str]) -> dict[str, Any]:
    """The validated record of one row; raises BadMessage naming the field at fault."""
    if len(cells) != len(header):
        raise BadMessage(f"has {len(cells)} field{'s' if len(cells) != 1 else ''} but the header has {len(header)}")
    fields = {field.name: field for field in FIELDS[kind]}
    record: dict[str, Any] = {}
    for name, text in zip(header, cells):
        field = fields.get(name)
        if field is None:
            continue
        if not text.isascii():
            try:
                text.encode("utf-8")  # lone surrogates are the bytes that were not UTF-8
            except UnicodeEncodeError:
                raise BadMessage(f"field {name!r} is not valid UTF-8") from None
        value = convert_cell(field, text)
        if value is not None:
            record[name] = value
    return parse_record(kind, record)


def _check_header(path: Path, kind: str, header: list[str] | None) -> list[str]:
    expected = ",".join(field.name for field in FIELDS[kind])
    if not header:
        raise InputDataError(f"{str(path)!r} has no header line; expected {expected!r}")
    header = [name.strip() for name in header]
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise InputDataError(f"{str(path)!r} header repeats column(s) {duplicates!r}; expected {expected!r}")
    missing = [field.name for field in FIELDS[kind] if field.required and field.name not in header]
    if missing:
        raise InputDataError(f"{str(path)!r} header lacks required column(s) {missing!r} for {kind}; "
                             f"expected {expected!r}")
    return header


def read_csv_records(path: str | Path, kind: str) -> Iterator[CsvRow]:
    """Open ``path`` and check its header now; then yield one :class:`CsvRow` per data row.

    A missing or unreadable file, or a header without the kind's required fields, raises
    InputDataError at once, before anything is published. Blank lines are skipped.
    """
    path = Path(path)
    if kind not in FIELDS:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {sorted(FIELDS)}")
    try:
        # surrogateescape keeps undecodable bytes so the row that holds them can be named
        handle = open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")
    except FileNotFoundError:
        raise InputDataError(f"{kind} file {str(path)!r} does not exist; create it with "
                             "'python -m pipeline datagen' or pass --file") from None
    except OSError as exc:
        raise InputDataError(f"{kind} file {str(path)!r} cannot be read: {exc.strerror}") from None
    reader = csv.reader(handle)
    try:
        header = _check_header(path, kind, next(reader, None))
    except BaseException:
        handle.close()
        raise
    return _rows(handle, reader, path.name, kind, header)


def _rows(handle, reader, name: str, kind: str, header: list[str]) -> Iterator[CsvRow]:
    with handle:
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # e.g. a field over the size limit; the reader goes on after it
                yield CsvRow(reader.line_num, None, f"{name} line {reader.line_num}: not valid CSV: {exc}")
                continue
            if not cells:
                continue
            try:
                yield CsvRow(reader.line_num, convert_row(kind, header, cells), None)
            except BadMessage as exc:
                yield CsvRow(reader.line_num, None, f"{name} line {reader.line_num}: {exc}")
