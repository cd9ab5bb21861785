"""The sample-data generator: deterministic users, items and orders CSVs in the wire format.

``python -m pipeline datagen`` writes ``users.csv``, ``users_late.csv``, ``items.csv`` and
``orders.csv`` whose headers are the wire field names (:mod:`pipeline.wire`) and whose times
are epoch milliseconds (-1 = none). The same arguments and seed always give byte-identical
files. The data has the shapes DESIGN.md §9 asks for, each one sized by a constant below:

- unknown users and items: some orders name ids that no CSV ever publishes;
- changelog history: some users have several versions, later rows being later versions;
- skew: a handful of hot users and hot items take a large share of the orders;
- late users: users whose only order comes early in ``orders.csv`` but who live only in
  ``users_late.csv``, which a demo publishes a few seconds after the orders.

Everything is drawn as whole numpy arrays and written in large chunks, so a million users
and five million orders take well under a minute on two cores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.dtypes import StringDType

from pipeline.errors import StatefulStreamsError
from pipeline.wire import FIELDS, NONE

TEXT = StringDType()

# ---------------------------------------------------------------- shape of the data
HOT_KEYS = 5  # hot users and hot items each
HOT_WEIGHTS = np.array([0.40, 0.25, 0.15, 0.12, 0.08])  # share of the hot traffic per hot key
HOT_SHARE = 0.25  # of invoices (users) and of line items (items) that go to hot keys
UNKNOWN_SHARE = 0.02  # of invoices with an unknown user, and of line items with an unknown item
UPDATED_SHARE = 0.15  # of ordinary users that get 1-4 later versions (hot users always get 3-4)
LATE_SHARE = 0.01  # of users that only arrive in users_late.csv
LATE_WINDOW = 0.05  # late users' orders fall in this leading share of the invoices
LINES_PER_INVOICE = np.array([0.40, 0.25, 0.15, 0.12, 0.08])  # P(1 line), P(2 lines), …
MIN_USERS, MIN_ITEMS, MIN_ORDERS = 20, 10, 100

DAY_MS = 86_400_000
ITEMS_FROM, USERS_FROM = 1_356_998_400_000, 1_388_534_400_000  # 2013-01-01, 2014-01-01
ORDERS_FROM, ORDERS_TO = 1_451_606_400_000, 1_483_228_800_000  # 2016-01-01 .. 2017-01-01
FIRST_INVOICE_ID = 100_000

# ---------------------------------------------------------------- vocabulary
# Plain words only: no comma, quote or newline, so no CSV field ever needs quoting.
FIRST_NAMES = np.array("""Ada Adebayo Aiko Alba Amara Anders Ana Arjun Bea Bruno Carla Chen Chidi Dario Dana
    Elif Emma Farah Felix Gita Hana Hugo Ines Ivan Jonas Juno Kai Kenji Lara Leon Lina Luca Maya Mateo Mira Nadia
    Nico Noor Olga Omar Paula Priya Rafael Rosa Sami Sara Sunita Tariq Tess Theo Uma Vera Wen Yara Yusuf Zoe""".split(),
                       dtype=TEXT)
LAST_NAMES = np.array("""Abebe Alvarez Andersen Bauer Becker Brown Campos Chen Costa Davis Diallo Dubois Evans
    Fischer Garcia Gomez Haddad Hansen Hoang Ibrahim Ito Jensen Kaur Khan Kim Kowalski Larsen Lee Lopez Martin
    Meyer Moreau Mwangi Nakamura Nguyen Novak Okafor Olsen Patel Petrov Powell Rossi Santos Schmidt Silva Singh
    Smith Suzuki Tanaka Taylor Torres Walker Wang Weber Wilson Yilmaz Zhang""".split(), dtype=TEXT)
DOMAINS = np.array(["example.com", "example.net", "example.org", "mail.example", "inbox.example",
                    "post.example"], dtype=TEXT)
CATEGORIES = np.array(["instrument", "gadget", "tool", "module", "widget", "apparatus", "device",
                       "appliance", "kit", "gizmo"], dtype=TEXT)
CATEGORY_PRICE = np.array([50.0, 35.0, 25.0, 100.0, 5.0, 300.0, 80.0, 150.0, 40.0, 20.0])
ADJECTIVES = np.array(["", "prize-winning", "matte", "industrial-strength", "extra-strength", "rechargeable",
                       "fuzzy", "miniature", "waterproof", "deluxe", "ergonomic", "portable", "vintage",
                       "glossy", "compact", "heavy-duty"], dtype=TEXT)
MODIFIERS = np.array(["", "", "", "cleaner", "wrapper", "warmer", "holder", "charger", "stand", "case",
                      "adapter"], dtype=TEXT)


@dataclass(frozen=True)
class Table:
    """One CSV: its wire kind (for the header) and one array per field, all the same length."""

    kind: str
    columns: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))


@dataclass(frozen=True)
class Keys:
    """Which ids play which part, decided before any table is drawn."""

    hot_users: np.ndarray
    late_users: np.ndarray
    regular_users: np.ndarray  # known, neither hot nor late: the uniform part of the traffic
    unknown_users: np.ndarray
    hot_items: np.ndarray
    regular_items: np.ndarray
    unknown_items: np.ndarray


def _cat(*parts) -> np.ndarray:
    """Element-wise string concatenation of arrays and plain strings."""
    result = parts[0]
    for part in parts[1:]:
        result = np.strings.add(result, part)
    return result


def choose_keys(rng: np.random.Generator, n_users: int, n_items: int) -> Keys:
    users = rng.permutation(np.arange(1, n_users + 1))
    n_late = max(1, int(n_users * LATE_SHARE))
    items = rng.permutation(np.arange(1, n_items + 1))
    return Keys(
        hot_users=users[:HOT_KEYS], late_users=np.sort(users[HOT_KEYS:HOT_KEYS + n_late]),
        regular_users=np.sort(users[HOT_KEYS + n_late:]),
        unknown_users=np.arange(n_users + 1, n_users + 1 + max(3, n_users // 100)),
        hot_items=items[:HOT_KEYS], regular_items=np.sort(items[HOT_KEYS:]),
        unknown_items=np.arange(n_items + 1, n_items + 1 + max(3, n_items // 50)),
    )


def _pick(rng, n: int, hot: np.ndarray, regular: np.ndarray, unknown: np.ndarray) -> np.ndarray:
    # [0, HOT_SHARE) hot, [HOT_SHARE, HOT_SHARE + UNKNOWN_SHARE) unknown, the rest regular
    draw = rng.random(n)
    ids = rng.choice(regular, n)
    is_hot = draw < HOT_SHARE
    ids[is_hot] = rng.choice(hot, int(is_hot.sum()), p=HOT_WEIGHTS)
    is_unknown = (draw >= HOT_SHARE) & (draw < HOT_SHARE + UNKNOWN_SHARE)
    if not is_unknown.any():  # tiny samples still get one, at the end, clear of the late users
        is_unknown[-1] = True
    ids[is_unknown] = rng.choice(unknown, int(is_unknown.sum()))
    return ids


def build_items(rng: np.random.Generator, keys: Keys) -> tuple[Table, dict[str, np.ndarray]]:
    """The published items, and the catalogue (published and unknown) that orders copy from."""
    ids = np.arange(1, keys.regular_items.size + keys.hot_items.size + keys.unknown_items.size + 1)
    n = ids.size
    category = rng.integers(0, CATEGORIES.size, n)
    adjective, modifier = ADJECTIVES[rng.integers(0, ADJECTIVES.size, n)], MODIFIERS[rng.integers(0, MODIFIERS.size, n)]
    # "prize-winning instrument cleaner", "instrument cleaner", "matte instrument", "instrument"
    name = _cat(adjective, np.where(adjective == "", "", " "), CATEGORIES[category],
                np.where(modifier == "", "", " "), modifier)
    catalogue = {
        "id": ids, "createdAt": ITEMS_FROM + rng.integers(0, 365, n) * DAY_MS + rng.integers(0, 86_400, n) * 1000,
        "adjective": adjective, "category": CATEGORIES[category], "modifier": modifier, "name": name,
        "price": np.round(CATEGORY_PRICE[category] * rng.uniform(0.5, 2.5, n), 2),
    }
    published = ids <= keys.regular_items.size + keys.hot_items.size
    return Table("items", {field: column[published] for field, column in catalogue.items()}), catalogue


def build_orders(rng: np.random.Generator, keys: Keys, catalogue: dict[str, np.ndarray], n_orders: int) -> Table:
    """Line items grouped in invoices, in time order; one invoice per late user, all early."""
    # lines per invoice, enough invoices to reach n_orders lines; the last invoice is cut short
    lines = rng.choice(np.arange(1, LINES_PER_INVOICE.size + 1), n_orders, p=LINES_PER_INVOICE)
    n_invoices = int(np.searchsorted(np.cumsum(lines), n_orders)) + 1
    lines = lines[:n_invoices]
    lines[-1] -= lines.sum() - n_orders
    if n_invoices < keys.late_users.size:
        raise StatefulStreamsError(f"--orders {n_orders} is too few for {keys.late_users.size} late users; "
                                   "pass more orders or fewer users")

    created = np.sort(rng.integers(ORDERS_FROM // 1000, ORDERS_TO // 1000, n_invoices)) * 1000
    paid = created + rng.integers(60, 3 * 86_400, n_invoices) * 1000
    paid[rng.random(n_invoices) < 0.08] = NONE  # never paid
    user = _pick(rng, n_invoices, keys.hot_users, keys.regular_users, keys.unknown_users)
    window = min(n_invoices, max(keys.late_users.size * 2, int(n_invoices * LATE_WINDOW)))
    user[rng.choice(window, keys.late_users.size, replace=False)] = rng.permutation(keys.late_users)

    invoice = np.repeat(np.arange(n_invoices), lines)  # row -> invoice index
    item = _pick(rng, n_orders, keys.hot_items, keys.regular_items, keys.unknown_items)
    quantity = rng.choice([1, 2, 3], n_orders, p=[0.8, 0.15, 0.05])
    return Table("orders", {
        "invoiceId": FIRST_INVOICE_ID + invoice, "lineItemId": rng.permutation(n_orders) + 1,
        "userId": user[invoice], "itemId": item,
        "itemName": catalogue["name"][item - 1], "itemCategory": catalogue["category"][item - 1],
        "price": np.round(catalogue["price"][item - 1] * quantity, 2),
        "createdAt": created[invoice], "paidAt": paid[invoice],
    })


def _emails(rng, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    # "ada.okafor1987@example.net"
    year = rng.integers(1950, 2005, first.size).astype(TEXT)
    return np.strings.lower(_cat(first, ".", last, year, "@", DOMAINS[rng.integers(0, DOMAINS.size, first.size)]))


def build_users(rng: np.random.Generator, keys: Keys, orders: Table) -> tuple[Table, Table]:
    """users.csv (first versions by id, then later versions round by round) and users_late.csv."""
    n_users = keys.hot_users.size + keys.late_users.size + keys.regular_users.size
    ids = np.arange(1, n_users + 1)
    first = FIRST_NAMES[rng.integers(0, FIRST_NAMES.size, n_users)]
    last = LAST_NAMES[rng.integers(0, LAST_NAMES.size, n_users)]
    email = _emails(rng, first, last)
    created = USERS_FROM + rng.integers(0, 2 * 365 * 86_400, n_users) * 1000
    # A late user signs up seconds before their one order, which is why their record lags behind it.
    ordered_at = np.full(n_users + 1, ORDERS_TO, dtype=np.int64)
    late_rows = np.isin(orders.columns["userId"], keys.late_users)
    np.minimum.at(ordered_at, orders.columns["userId"][late_rows], orders.columns["createdAt"][late_rows])
    created[keys.late_users - 1] = ordered_at[keys.late_users] - rng.integers(1, 60, keys.late_users.size) * 1000
    none = np.full(n_users, NONE, dtype=np.int64)
    versions = [{"id": ids, "firstName": first.copy(), "lastName": last.copy(), "emailAddress": email.copy(),
                 "createdAt": created, "deletedAt": none, "mergedAt": none, "parentUserId": none}]

    # later versions: round k holds the k-th update of every user with at least k updates
    n_updates = np.zeros(n_users + 1, dtype=np.int64)
    n_updates[keys.regular_users] = np.where(rng.random(keys.regular_users.size) < UPDATED_SHARE,
                                             rng.integers(1, 5, keys.regular_users.size), 0)
    n_updates[keys.hot_users] = rng.integers(3, 5, keys.hot_users.size)
    for k in range(1, int(n_updates.max()) + 1):
        who = rng.permutation(np.flatnonzero(n_updates >= k))
        index = who - 1
        renamed = rng.random(who.size) < 0.2
        last[index[renamed]] = LAST_NAMES[rng.integers(0, LAST_NAMES.size, int(renamed.sum()))]
        email[index] = _emails(rng, first[index], last[index])
        when = ORDERS_FROM + rng.integers(0, 365 * 86_400, who.size) * 1000
        # a regular user's last version may delete the account or merge it into another user
        final = (n_updates[who] == k) & np.isin(who, keys.regular_users)
        ends = rng.random(who.size)
        deleted, merged = final & (ends < 0.03), final & (ends >= 0.03) & (ends < 0.06)
        versions.append({
            "id": who, "firstName": first[index], "lastName": last[index], "emailAddress": email[index],
            "createdAt": created[index], "deletedAt": np.where(deleted, when, NONE),
            "mergedAt": np.where(merged, when, NONE),
            "parentUserId": np.where(merged, rng.choice(keys.regular_users, who.size), NONE),
        })
    columns = {field: np.concatenate([v[field] for v in versions]) for field in versions[0]}
    is_late = np.isin(columns["id"], keys.late_users)
    return (Table("users", {f: c[~is_late] for f, c in columns.items()}),
            Table("users", {f: c[is_late] for f, c in columns.items()}))


def generate(n_users: int, n_items: int, n_orders: int, seed: int) -> dict[str, Table]:
    """The four tables, by file stem; the same arguments always give the same tables."""
    for flag, value, minimum in (("--users", n_users, MIN_USERS), ("--items", n_items, MIN_ITEMS),
                                 ("--orders", n_orders, MIN_ORDERS)):
        if value < minimum:
            raise StatefulStreamsError(f"datagen {flag} must be at least {minimum}, got {value!r}")
    # one independent stream per table, so e.g. more orders leave the users unchanged
    keys_rng, items_rng, orders_rng, users_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    keys = choose_keys(keys_rng, n_users, n_items)
    items, catalogue = build_items(items_rng, keys)
    orders = build_orders(orders_rng, keys, catalogue, n_orders)
    users, users_late = build_users(users_rng, keys, orders)
    return {"users": users, "users_late": users_late, "items": items, "orders": orders}


def write_csv(path: Path, table: Table, chunk_rows: int = 500_000) -> None:
    """Write a table as CSV with the wire field names as header, a chunk of rows at a time."""
    fields = [field.name for field in FIELDS[table.kind]]
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        out.write(",".join(fields) + "\n")
        for start in range(0, table.rows, chunk_rows):
            # numpy renders ints plainly and floats as their shortest repr: deterministic text
            lines = table.columns[fields[0]][start:start + chunk_rows].astype(TEXT)
            for name in fields[1:]:
                lines = _cat(lines, ",", table.columns[name][start:start + chunk_rows].astype(TEXT))
            out.write("\n".join(lines.tolist()) + "\n")


def main(args, settings=None) -> None:
    """``python -m pipeline datagen``: write the four CSVs into ``--out`` and say what they hold."""
    started = time.perf_counter()
    tables = generate(args.users, args.items, args.orders, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stem, table in tables.items():
        write_csv(out / f"{stem}.csv", table)
        print(f"{out / (stem + '.csv')}: {table.rows} rows")
    print(f"generated in {time.perf_counter() - started:.1f}s (seed {args.seed})")
