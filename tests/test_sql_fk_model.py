"""A foreign-key join's results against a small pure-Python reference, on a seeded random changelog.

The reference (:func:`reference_join`, :func:`reference_chain`) is the join as a table: apply every
message in order to the tables, then join each user to its account (and, in the chain, to its
color by key and its account's plan). The pipeline runs a statement set of the LEFT and the INNER
join and an N-way chain over the same topics (one query, each INSERT its own operators); the
messages go in chunks, each published once the previous chunk's results match the reference, so
every chunk's moves, renames and deletes are checked however the source cuts its batches.
"""

from __future__ import annotations

import random

import pytest

from factories import publish
from pipeline.sql.script import build_pipeline
from sqlhelp import Running, fresh_topics, latest_per_key, message, read_topic, result
from test_sql_semantics import TABLE
from waiting import wait_for

pytestmark = pytest.mark.e2e

SQL = "\n".join([
    TABLE.format(name="users", columns="uid STRING, accountId STRING, n INT", key="uid"),
    TABLE.format(name="accounts", columns="id STRING, name STRING, planId STRING", key="id"),
    TABLE.format(name="plans", columns="id STRING, tier STRING", key="id"),
    TABLE.format(name="colors", columns="userUid STRING, color STRING", key="userUid"),
    TABLE.format(name="out_left", columns="uid STRING, accountId STRING, account STRING, n INT", key="uid"),
    TABLE.format(name="out_inner", columns="uid STRING, account STRING", key="uid"),
    TABLE.format(name="out_chain", columns="uid STRING, account STRING, tier STRING, color STRING", key="uid"),
    "INSERT INTO out_left SELECT u.uid, u.accountId, a.name, u.n FROM users u LEFT JOIN accounts a ON u.accountId = a.id;",
    "INSERT INTO out_inner SELECT u.uid, a.name FROM users u JOIN accounts a ON a.id = u.accountId;",
    # a join on the driving key, a foreign key of the driving table, and one of the joined accounts
    "INSERT INTO out_chain SELECT u.uid, a.name, p.tier, c.color FROM users u JOIN colors c ON c.userUid = u.uid "
    "LEFT JOIN accounts a ON u.accountId = a.id JOIN plans p ON a.planId = p.id;",
])


KINDS = ("left", "inner", "chain")


def random_changelog(rng: random.Random, count: int) -> list[tuple[str, str, dict | None]]:
    """(table, key, record or None) messages over few keys, so rows move, change and go often."""
    found = []
    for n in range(count):
        draw = rng.random()
        if draw < 0.4:
            uid = f"u{rng.randrange(6)}"
            record = None if rng.random() < 0.15 else {"uid": uid, "accountId": rng.choice(["A", "B", "C", None]), "n": n}
            found.append(("users", uid, record))
        elif draw < 0.65:
            key = rng.choice("ABCD")
            record = {"id": key, "name": f"{key}{n}", "planId": rng.choice(["P1", "P2", None])}
            found.append(("accounts", key, None if rng.random() < 0.3 else record))
        elif draw < 0.77:
            key = rng.choice(["P1", "P2"])
            found.append(("plans", key, None if rng.random() < 0.25 else {"id": key, "tier": f"t{n}"}))
        else:
            uid = f"u{rng.randrange(6)}"
            found.append(("colors", uid, None if rng.random() < 0.2 else {"userUid": uid, "color": f"c{n}"}))
    return found


def apply_messages(messages) -> dict[str, dict]:
    """Each table's rows by key after the messages."""
    tables: dict[str, dict] = {"users": {}, "accounts": {}, "plans": {}, "colors": {}}
    for table, key, record in messages:
        if record is None:
            tables[table].pop(key, None)
        else:
            tables[table][key] = record
    return tables


def reference_chain(messages) -> list[dict]:
    """out_chain after the messages: a user with a color, an account and that account's plan."""
    tables, rows = apply_messages(messages), []
    for uid, user in sorted(tables["users"].items()):
        color = tables["colors"].get(uid)
        account = tables["accounts"].get(user["accountId"]) if user["accountId"] is not None else None
        plan = tables["plans"].get(account.get("planId")) if account and account.get("planId") else None
        if color and plan:  # INNER JOINs; a LEFT JOIN's missing account has no plan either
            rows.append({"uid": uid, "account": account["name"], "tier": plan["tier"], "color": color["color"]})
    return rows


def reference_join(messages, inner: bool) -> list[dict]:
    """The joined table after the messages, one row per user, sorted by uid."""
    tables, rows = apply_messages(messages), []
    for uid, user in sorted(tables["users"].items()):
        account = tables["accounts"].get(user["accountId"]) if user["accountId"] is not None else None
        if inner and account is None:
            continue
        name = account["name"] if account else None
        rows.append({"uid": uid, "account": name} if inner else
                    {"uid": uid, "accountId": user["accountId"], "account": name, "n": user["n"]})
    return rows


def test_reference_join_reads_a_null_foreign_key_and_a_deleted_account_as_no_account():
    messages = [("accounts", "A", {"id": "A", "name": "Acme"}), ("users", "u1", {"uid": "u1", "accountId": "A", "n": 1}),
                ("users", "u2", {"uid": "u2", "accountId": None, "n": 2}), ("accounts", "A", None),
                ("users", "u3", {"uid": "u3", "accountId": "A", "n": 3}), ("accounts", "A", {"id": "A", "name": "Ace"})]
    assert reference_join(messages[:4], inner=True) == []
    assert reference_join(messages[:4], inner=False)[0] == {"uid": "u1", "accountId": "A", "account": None, "n": 1}
    assert reference_join(messages, inner=True) == [{"uid": "u1", "account": "Ace"}, {"uid": "u3", "account": "Ace"}]


def test_reference_chain_needs_a_color_an_account_and_its_plan():
    color, plan = ("colors", "u1", {"userUid": "u1", "color": "red"}), ("plans", "P1", {"id": "P1", "tier": "free"})
    messages = [("users", "u1", {"uid": "u1", "accountId": "A", "n": 1}), ("accounts", "A", {"id": "A", "name": "Acme",
                                                                                          "planId": "P1"})]
    assert reference_chain(messages + [color]) == [] and reference_chain(messages + [plan]) == []
    assert reference_chain(messages + [color, plan]) == [
        {"uid": "u1", "account": "Acme", "tier": "free", "color": "red"}]
    assert reference_chain(messages + [color, plan, ("accounts", "A", None)]) == []


def test_a_random_changelog_joins_as_the_reference_says_after_every_chunk(settings_factory, broker, spark):
    # seed 40: every chunk adds and retracts chain rows (its joins' results: [], [u4, u5], [u1], [u0, u5])
    messages = random_changelog(random.Random(40), 80)
    topics = fresh_topics("users", "accounts", "plans", "colors", "out_left", "out_inner", "out_chain")
    settings = settings_factory(job__restart__delay="3s")
    url = broker.service_url

    def send(chunk) -> None:
        # the joined table depends on each table's order only, not on how the two interleave
        for table in ("users", "accounts", "plans", "colors"):
            publish(url, topics[table], [message(key, record) for name, key, record in chunk if name == table])

    def results() -> tuple[list[dict], ...]:
        return tuple(sorted(result(settings, "fk-model", sink=f"result_out_{kind}"), key=lambda r: r["uid"])
                     for kind in KINDS)

    chunks = [messages[i:i + 20] for i in range(0, len(messages), 20)]
    send(chunks[0])
    with Running(settings, build_pipeline(SQL, topics), "fk-model", spark) as running:
        for index in range(len(chunks)):
            if index:
                send(chunks[index])
            seen = messages[:20 * (index + 1)]
            wanted = (reference_join(seen, inner=False), reference_join(seen, inner=True), reference_chain(seen))

            def matches():
                if running.error:  # the pipeline's own error, at once, if it stopped
                    raise running.error[0]
                return results() == wanted

            wait_for(matches, 240 if index == 0 else 120, what=f"chunk {index}'s joined rows")
    for kind, rows in zip(KINDS, wanted):
        # the upsert topic's table is the result too: no retraction sent after a moved row's new row
        assert latest_per_key(read_topic(url, topics[f"out_{kind}"])) == {row["uid"]: row for row in rows}
