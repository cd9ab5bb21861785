"""Reading wire records from CSV: typed cells, validated rows, and bad rows named by line."""

from __future__ import annotations

import re

import pytest

from pipeline.feed.csv_records import convert_row, read_csv_records
from pipeline.errors import InputDataError
from pipeline.wire import BadMessage

ORDER_HEADER = "invoiceId,lineItemId,userId,itemId,itemName,itemCategory,price,createdAt,paidAt"


def write(tmp_path, text: str | bytes, name: str = "orders.csv"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_good_rows_become_typed_records(tmp_path):
    path = write(tmp_path, f"{ORDER_HEADER}\n7,1,42,3,matte tool,tool,12.5,1000,-1\n7,2,42,4,,kit,3,1000,\n")
    rows = list(read_csv_records(path, "orders"))
    assert [row.line for row in rows] == [2, 3]
    assert rows[0].record == {"invoiceId": 7, "lineItemId": 1, "userId": 42, "itemId": 3, "itemName": "matte tool",
                              "itemCategory": "tool", "price": 12.5, "createdAt": 1000, "paidAt": -1}
    # an empty optional time takes its default; an empty text stays an empty text
    assert rows[1].record["paidAt"] == -1 and rows[1].record["itemName"] == ""
    assert isinstance(rows[1].record["price"], float)


def test_columns_may_come_in_any_order_and_extra_ones_are_ignored(tmp_path):
    path = write(tmp_path, "name,price,id,note\nwidget,5.0,9,whatever\n", name="items.csv")
    [row] = read_csv_records(path, "items")
    assert row.record == {"id": 9, "createdAt": -1, "adjective": None, "category": None, "modifier": None,
                          "name": "widget", "price": 5.0}


@pytest.mark.parametrize("line, error", [
    ("7,1,abc,3,x,tool,1.0,1000,-1", "field 'userId' must be an integer, got 'abc'"),
    ("7,1,2.5,3,x,tool,1.0,1000,-1", "field 'userId' must be an integer, got '2.5'"),
    ("7,1,42,3,x,tool,,1000,-1", "field 'price' is empty; it is required"),
    ("7,1,42,3,x,tool,cheap,1000,-1", "field 'price' must be a number, got 'cheap'"),
    ("7,1,42,3,x,tool,nan,1000,-1", "field 'price' must be a number, got 'nan'"),
    ("7,1,42,3,x,tool,1.0,1000", "has 8 fields but the header has 9"),
    ("7,1,42,3,x,tool,1.0,1000,-1,extra", "has 10 fields but the header has 9"),
    ("7,1,42,3,x,tool,1.0,99999999999999999999,-1", "field 'createdAt' = 99999999999999999999 is outside the 64-bit range"),
])
def test_a_bad_row_is_named_by_file_line_and_field(tmp_path, line, error):
    path = write(tmp_path, f"{ORDER_HEADER}\n7,1,42,3,x,tool,1.0,1000,-1\n{line}\n")
    good, bad = read_csv_records(path, "orders")
    assert good.error is None
    assert (bad.line, bad.record, bad.error) == (3, None, f"orders.csv line 3: {error}")


def test_invalid_utf8_is_named_and_the_rows_after_it_still_read(tmp_path):
    path = write(tmp_path, f"{ORDER_HEADER}\n".encode() + b"7,1,42,3,caf\xe9,tool,1.0,1000,-1\n"
                 b"8,1,42,3,caf\xc3\xa9,tool,1.0,1000,-1\n")
    bad, good = read_csv_records(path, "orders")
    assert bad.error == "orders.csv line 2: field 'itemName' is not valid UTF-8"
    assert good.record["itemName"] == "café"


def test_blank_lines_are_skipped_and_line_numbers_stay_physical(tmp_path):
    path = write(tmp_path, f'{ORDER_HEADER}\n\n7,1,42,3,"two\nlines",tool,1.0,1000,-1\n\n8,1,x,3,a,b,1,1,1\n')
    rows = list(read_csv_records(path, "orders"))
    assert [row.line for row in rows] == [4, 6]
    assert rows[0].record["itemName"] == "two\nlines"
    assert rows[1].error.startswith("orders.csv line 6: field 'userId'")


def test_a_missing_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(InputDataError, match=re.escape(f"orders file {str(missing)!r} does not exist")):
        read_csv_records(missing, "orders")


def test_a_header_without_required_columns_fails_before_any_row(tmp_path):
    path = write(tmp_path, "invoiceId,lineItemId,userId,itemName\n1,2,3,x\n")
    with pytest.raises(InputDataError, match=re.escape("header lacks required column(s) ['itemId', 'price', 'createdAt']")):
        read_csv_records(path, "orders")


@pytest.mark.parametrize("text, message", [("", "has no header line"), ("id,id,price\n", "header repeats column(s) ['id']")])
def test_an_empty_file_or_a_repeated_column_is_refused(tmp_path, text, message):
    with pytest.raises(InputDataError, match=re.escape(message)):
        read_csv_records(write(tmp_path, text, name="items.csv"), "items")


def test_a_byte_order_mark_does_not_hide_the_first_column(tmp_path):
    path = write(tmp_path, "\ufeffid,price\n1,2\n", name="items.csv")
    assert [row.record["id"] for row in read_csv_records(path, "items")] == [1]


def test_convert_row_checks_with_the_wire_rules():
    with pytest.raises(BadMessage, match=re.escape("field 'id' is empty; it is required")):
        convert_row("users", ["id", "firstName"], [" ", "Ada"])
    assert convert_row("users", ["id", "firstName"], [" 12 ", "Ada"])["id"] == 12
