"""The sample-data generator: deterministic, in the wire format, with the properties of DESIGN.md §9.

The §9 properties are measured on the committed sample in data/, after checking that it is
exactly what the generator makes with the CLI defaults.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from pipeline.feed import datagen
from pipeline.cli import build_parser
from pipeline.feed.csv_records import read_csv_records
from pipeline.errors import StatefulStreamsError
from pipeline.wire import FIELDS

DATA = Path(__file__).resolve().parent.parent / "data"
FILES = {"users": "users", "users_late": "users", "items": "items", "orders": "orders"}  # file stem -> kind


def run_datagen(out: Path, *flags: str) -> dict[str, Path]:
    args = build_parser().parse_args(["datagen", "--out", str(out), *flags])
    datagen.main(args, None)
    return {stem: out / f"{stem}.csv" for stem in FILES}


def load(path: Path, kind: str) -> list[dict]:
    rows = list(read_csv_records(path, kind))
    errors = [row.error for row in rows if row.error]
    assert not errors, errors[:3]
    return [row.record for row in rows]


@pytest.fixture(scope="module")
def sample() -> dict[str, list[dict]]:
    """The committed sample, every row parsed and validated like the producers do."""
    return {stem: load(DATA / f"{stem}.csv", kind) for stem, kind in FILES.items()}


def test_same_seed_gives_byte_identical_files(tmp_path):
    first = run_datagen(tmp_path / "a", "--users", "300", "--items", "40", "--orders", "3000", "--seed", "7")
    again = run_datagen(tmp_path / "b", "--users", "300", "--items", "40", "--orders", "3000", "--seed", "7")
    other = run_datagen(tmp_path / "c", "--users", "300", "--items", "40", "--orders", "3000", "--seed", "8")
    for stem in FILES:
        assert first[stem].read_bytes() == again[stem].read_bytes(), stem
    assert first["orders"].read_bytes() != other["orders"].read_bytes()


def test_more_orders_leave_users_and_items_unchanged(tmp_path):
    small = run_datagen(tmp_path / "a", "--users", "300", "--items", "40", "--orders", "3000")
    large = run_datagen(tmp_path / "b", "--users", "300", "--items", "40", "--orders", "6000")
    assert small["items"].read_bytes() == large["items"].read_bytes()
    assert len(load(large["orders"], "orders")) == 6000


def test_committed_sample_is_what_the_defaults_make(tmp_path, capsys):
    fresh = run_datagen(tmp_path)
    for stem in FILES:
        assert (DATA / f"{stem}.csv").read_bytes() == fresh[stem].read_bytes(), (
            f"data/{stem}.csv is stale: run 'python -m pipeline datagen --out data'")
    assert "orders.csv: 20000 rows" in capsys.readouterr().out
    size = sum((DATA / f"{stem}.csv").stat().st_size for stem in FILES)
    assert size < 5_000_000, f"the committed sample is {size} bytes; keep it to a few MB"


@pytest.mark.parametrize("stem", FILES)
def test_headers_are_the_wire_field_names(stem):
    header = (DATA / f"{stem}.csv").read_text().splitlines()[0]
    assert header == ",".join(field.name for field in FIELDS[FILES[stem]])


def test_every_row_is_a_valid_record(sample):
    lines = {stem: (DATA / f"{stem}.csv").read_text().count("\n") - 1 for stem in FILES}
    assert {stem: len(records) for stem, records in sample.items()} == lines
    assert len(sample["orders"]) == 20000
    assert not any('"' in line or "\r" in line for line in (DATA / "orders.csv").read_text().splitlines())


def test_orders_name_unknown_users_and_unknown_items(sample):
    published_users = {u["id"] for u in sample["users"] + sample["users_late"]}
    items = {i["id"] for i in sample["items"]}
    orders = sample["orders"]
    unknown_users = [o for o in orders if o["userId"] not in published_users]
    unknown_items = [o for o in orders if o["itemId"] not in items]
    assert 0.005 < len(unknown_users) / len(orders) < 0.05
    assert 0.005 < len(unknown_items) / len(orders) < 0.05
    assert len({o["userId"] for o in unknown_users}) >= 3


def test_some_users_have_several_versions_that_differ(sample):
    versions = defaultdict(list)
    for user in sample["users"]:
        versions[user["id"]].append(user)
    several = {uid: rows for uid, rows in versions.items() if len(rows) >= 3}
    assert len(several) >= 50
    for rows in several.values():
        assert len({row["emailAddress"] for row in rows}) > 1  # each version changes something
        assert len({row["createdAt"] for row in rows}) == 1  # still the same user
    # a deletion or a merge is only ever a user's last version
    for rows in versions.values():
        assert all(row["deletedAt"] == -1 and row["mergedAt"] == -1 for row in rows[:-1])
    assert any(rows[-1]["deletedAt"] != -1 for rows in versions.values())
    assert any(rows[-1]["mergedAt"] != -1 and rows[-1]["parentUserId"] in versions for rows in versions.values())


def test_hot_keys_take_a_large_share_of_orders(sample):
    orders = sample["orders"]
    for field in ("userId", "itemId"):
        counts = Counter(o[field] for o in orders).most_common()
        top5 = sum(count for _, count in counts[:5])
        median = counts[len(counts) // 2][1]
        assert top5 / len(orders) > 0.2, field
        assert counts[0][1] > 20 * median, (field, counts[:6], median)


def test_hot_users_are_also_updated_several_times(sample):
    versions = Counter(u["id"] for u in sample["users"])
    hottest = [uid for uid, _ in Counter(o["userId"] for o in sample["orders"]).most_common(5)]
    assert all(versions[uid] >= 4 for uid in hottest)


def test_late_users_have_early_orders_and_are_only_in_the_late_file(sample):
    late = {u["id"]: u for u in sample["users_late"]}
    assert len(late) == 20
    assert not late.keys() & {u["id"] for u in sample["users"]}
    orders = sample["orders"]
    rows = [i for i, o in enumerate(orders) if o["userId"] in late]
    assert {orders[i]["userId"] for i in rows} == late.keys()
    assert max(rows) < 0.06 * len(orders)  # early in the file: published before users_late.csv
    for i in rows:  # signed up just before ordering, which is why the record lags behind
        assert 0 < orders[i]["createdAt"] - late[orders[i]["userId"]]["createdAt"] < 60_000


def test_orders_are_invoices_of_line_items_in_time_order(sample):
    items = {i["id"]: i for i in sample["items"]}
    orders = sample["orders"]
    lines = Counter(o["invoiceId"] for o in orders)
    assert max(lines.values()) >= 4 and min(lines.values()) == 1
    assert len({o["lineItemId"] for o in orders}) == len(orders)
    assert all(a["createdAt"] <= b["createdAt"] for a, b in zip(orders, orders[1:]))
    for order in orders:
        assert order["paidAt"] == -1 or order["paidAt"] > order["createdAt"]
        item = items.get(order["itemId"])
        if item:
            assert (order["itemName"], order["itemCategory"]) == (item["name"], item["category"])
            assert order["price"] in {round(item["price"] * q, 2) for q in (1, 2, 3)}
    by_invoice = defaultdict(set)
    for order in orders:
        by_invoice[order["invoiceId"]].add((order["userId"], order["createdAt"], order["paidAt"]))
    assert all(len(v) == 1 for v in by_invoice.values())  # one user and one time per invoice


def test_item_names_join_adjective_category_and_modifier(sample):
    for item in sample["items"]:
        assert item["name"] == " ".join(p for p in (item["adjective"], item["category"], item["modifier"]) if p)
    assert any(not item["adjective"] for item in sample["items"])
    assert any(not item["modifier"] for item in sample["items"])


def test_too_small_a_sample_is_refused_with_the_flag_named(tmp_path):
    with pytest.raises(StatefulStreamsError, match=re.escape("datagen --users must be at least 20, got 5")):
        run_datagen(tmp_path, "--users", "5")
    assert not (tmp_path / "users.csv").exists()


def test_smallest_sample_still_has_every_property(tmp_path):
    files = run_datagen(tmp_path, "--users", "20", "--items", "10", "--orders", "100", "--seed", "3")
    users = load(files["users"], "users") + load(files["users_late"], "users")
    orders = load(files["orders"], "orders")
    assert len(orders) == 100
    assert load(files["users_late"], "users")
    assert any(o["userId"] not in {u["id"] for u in users} for o in orders)
    assert any(o["itemId"] not in {i["id"] for i in load(files["items"], "items")} for o in orders)
