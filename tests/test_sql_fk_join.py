"""Foreign-key joins (``ON u.accountId = a.id``), LEFT and INNER, end to end, table-driven as
tests/test_sql_semantics.py: each step's exact changelog on the upsert topic and the current result.

A step of one message is one micro-batch, so a driving row that moves from one account to another
gets its retraction (from the old account) and its new row (from the new one) in the same batch:
the topic must show only the new row.
"""

from __future__ import annotations

import pulsar
import pytest

from pipeline.sql.plan import build_plan
from pipeline.sql.samples import load_samples, publish_samples
from sqlhelp import SQL_DIR, Running, fresh_topics, latest_per_key, read_topic
from test_sql_semantics import Case, check_changelog, row
from waiting import wait_for

pytestmark = pytest.mark.e2e

ACCOUNTS = (("accounts", "id STRING, name STRING", "id"),)


def user(uid: str, account: str | None) -> tuple:
    return (uid, {"uid": uid, "accountId": account} if account else {"uid": uid})


def account(key: str, name: str | None) -> tuple:
    return ("accounts", key, {"id": key, "name": name} if name else None)


def regional(key: str, name: str, region: str) -> tuple:
    return ("accounts", key, {"id": key, "name": name, "region": region})


CASES = [
    Case("left_join_on_a_foreign_key",
         "uid STRING, accountId STRING",
         "uid STRING, accountId STRING, account STRING",
         "INSERT INTO out SELECT u.uid, u.accountId, a.name FROM users u LEFT JOIN accounts a ON u.accountId = a.id",
         (
             # a NULL foreign key matches nothing; a missing account reads NULL
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), user("u4", None), account("A", "Acme")),
              (("u1", row(uid="u1", accountId="A", account="Acme")), ("u2", row(uid="u2", accountId="A", account="Acme")),
               ("u3", row(uid="u3", accountId="B", account=None)), ("u4", row(uid="u4", accountId=None, account=None)))),
             ((account("B", "Beta"),), (("u3", row(uid="u3", accountId="B", account="Beta")),)),
             # u1 moves from A to B in one batch: its new row only, not A's retraction after it
             ((user("u1", "B"),), (("u1", row(uid="u1", accountId="B", account="Beta")),)),
             # a referenced row's change updates every row that references it now, and only those
             ((account("A", "Acme 2"),), (("u2", row(uid="u2", accountId="A", account="Acme 2")),)),
             ((account("B", None),), (("u1", row(uid="u1", accountId="B", account=None)),
                                      ("u3", row(uid="u3", accountId="B", account=None)))),
             ((("u2", None),), (("u2", ""),)),
             # tombstones of a user and an account never seen send nothing
             ((("u9", None), account("Z", None)), ()),
             ((user("u3", "A"),), (("u3", row(uid="u3", accountId="A", account="Acme 2")),)),
         ),
         joined=ACCOUNTS),
    Case("inner_join_on_a_foreign_key",
         "uid STRING, accountId STRING",
         "uid STRING, account STRING",
         "INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.id",
         (
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), account("A", "Acme")),
              (("u1", row(uid="u1", account="Acme")), ("u2", row(uid="u2", account="Acme")))),
             ((account("B", "Beta"),), (("u3", row(uid="u3", account="Beta")),)),
             # to an account that is not there: retracted; to one that is: the new row wins
             ((user("u1", "C"),), (("u1", ""),)),
             ((user("u2", "B"),), (("u2", row(uid="u2", account="Beta")),)),
             # the referenced row goes: every row referencing it is retracted
             ((account("B", None),), (("u2", ""), ("u3", ""))),
             ((("u9", None),), ()),
             ((account("C", "Cee"),), (("u1", row(uid="u1", account="Cee")),)),
             ((("u1", None),), (("u1", ""),)),
             # nothing references C any more: its delete sends nothing; B's return brings back both
             ((account("C", None),), ()),
             ((account("B", "Beta 2"),), (("u2", row(uid="u2", account="Beta 2")), ("u3", row(uid="u3", account="Beta 2")))),
         ),
         joined=ACCOUNTS),
    Case("group_by_over_a_foreign_key_join",
         "uid STRING, accountId STRING",
         "account STRING, users BIGINT",
         "INSERT INTO out SELECT COALESCE(a.name, 'none'), COUNT(*) FROM users u LEFT JOIN accounts a "
         "ON u.accountId = a.id GROUP BY COALESCE(a.name, 'none')",
         (
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), account("A", "Acme")),
              (("Acme", row(account="Acme", users=2)), ("none", row(account="none", users=1)))),
             # a user's move takes it out of its old group and into the new one
             ((user("u2", "B"),), (("Acme", row(account="Acme", users=1)), ("none", row(account="none", users=2)))),
             # an account's rename moves every user in it
             ((account("B", "Beta"),), (("Beta", row(account="Beta", users=2)), ("none", ""))),
             ((account("A", None),), (("Acme", ""), ("none", row(account="none", users=1)))),
             ((("u3", None),), (("Beta", row(account="Beta", users=1)),)),
         ),
         joined=ACCOUNTS),
    Case("where_on_the_referenced_table_of_a_foreign_key_join",
         "uid STRING, accountId STRING",
         "uid STRING, account STRING",
         "INSERT INTO out SELECT u.uid, a.name FROM users u LEFT JOIN accounts a ON u.accountId = a.id "
         "WHERE a.region = 'eu'",
         (
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), regional("A", "Acme", "eu"),
               regional("B", "Beta", "us")),
              (("u1", row(uid="u1", account="Acme")), ("u2", row(uid="u2", account="Acme")))),
             # an account that moves out of 'eu' retracts every user in it; one that moves in brings its users
             ((regional("A", "Acme", "us"),), (("u1", ""), ("u2", ""))),
             ((regional("B", "Beta", "eu"),), (("u3", row(uid="u3", account="Beta")),)),
             # a user that moves to an 'eu' account appears; one that moves out of 'eu' is retracted
             ((user("u1", "B"),), (("u1", row(uid="u1", account="Beta")),)),
             ((user("u3", "A"),), (("u3", ""),)),
             # a matching account's delete (LEFT: its columns NULL, which does not match) retracts its users
             ((account("B", None),), (("u1", ""),)),
             # changes of rows that match neither before nor now send nothing; A's return brings back u3 (u2 left)
             ((user("u2", "C"), account("C", None)), ()),
             ((regional("A", "Acme 2", "eu"),), (("u3", row(uid="u3", account="Acme 2")),)),
         ),
         joined=(("accounts", "id STRING, name STRING, region STRING", "id"),)),
]


def plan_of(key: str, tier: str | None) -> tuple:
    return ("plans", key, {"id": key, "tier": tier} if tier else None)


def planned(key: str, name: str, plan: str | None) -> tuple:
    return ("accounts", key, {"id": key, "name": name, "planId": plan} if plan else {"id": key, "name": name})


def color(uid: str, value: str | None) -> tuple:
    return ("colors", uid, {"userUid": uid, "color": value} if value else None)


COLORS = ("colors", "userUid STRING, color STRING", "userUid")
PLANS = (("accounts", "id STRING, name STRING, planId STRING", "id"), ("plans", "id STRING, tier STRING", "id"))

# N-way chains: a foreign-key join then a join on the driving key, and a foreign key of a joined table
CASES += [
    Case("a_foreign_key_join_then_a_key_join",
         "uid STRING, accountId STRING",
         "uid STRING, account STRING, color STRING",
         "INSERT INTO out SELECT u.uid, a.name, c.color FROM users u LEFT JOIN accounts a ON u.accountId = a.id "
         "LEFT JOIN colors c ON u.uid = c.userUid",
         (
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), account("A", "Acme"), color("u1", "red"),
               color("u9", "blue")),
              (("u1", row(uid="u1", account="Acme", color="red")), ("u2", row(uid="u2", account="Acme", color=None)),
               ("u3", row(uid="u3", account=None, color=None)))),
             ((color("u2", "green"),), (("u2", row(uid="u2", account="Acme", color="green")),)),
             ((account("A", "Acme 2"),), (("u1", row(uid="u1", account="Acme 2", color="red")),
                                          ("u2", row(uid="u2", account="Acme 2", color="green")))),
             # u1 moves to an account not there yet: one row, its color kept
             ((user("u1", "B"),), (("u1", row(uid="u1", account=None, color="red")),)),
             ((account("B", "Beta"),), (("u1", row(uid="u1", account="Beta", color="red")),
                                        ("u3", row(uid="u3", account="Beta", color=None)))),
             # the middle table's row goes: its users keep their row, its columns NULL
             ((account("A", None),), (("u2", row(uid="u2", account=None, color="green")),)),
             # (a step's messages on other keys may come in one batch or several: the same changelog)
             ((color("u1", None), ("u2", None)), (("u1", row(uid="u1", account="Beta", color=None)), ("u2", ""))),
             # a color with no user and an account tombstone: nothing until u2's return finds its color
             ((color("u2", "pink"), account("Z", None), user("u2", "B")),
              (("u2", row(uid="u2", account="Beta", color="pink")),)),
         ),
         joined=(ACCOUNTS[0], COLORS)),
    Case("inner_chain_of_foreign_keys",
         "uid STRING, accountId STRING",
         "uid STRING, account STRING, tier STRING",
         "INSERT INTO out SELECT u.uid, a.name, p.tier FROM users u JOIN accounts a ON u.accountId = a.id "
         "JOIN plans p ON a.planId = p.id",
         (
             # u3's account's plan is missing: no row
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), planned("A", "Acme", "P1"),
               planned("B", "Beta", "P2"), plan_of("P1", "free")),
              (("u1", row(uid="u1", account="Acme", tier="free")), ("u2", row(uid="u2", account="Acme", tier="free")))),
             ((plan_of("P2", "pro"),), (("u3", row(uid="u3", account="Beta", tier="pro")),)),
             # the middle table's foreign key moves: every user of it follows
             ((planned("A", "Acme", "P2"),), (("u1", row(uid="u1", account="Acme", tier="pro")),
                                              ("u2", row(uid="u2", account="Acme", tier="pro")))),
             ((user("u1", "B"),), (("u1", row(uid="u1", account="Beta", tier="pro")),)),
             ((plan_of("P2", "gold"),), (("u1", row(uid="u1", account="Beta", tier="gold")),
                                         ("u2", row(uid="u2", account="Acme", tier="gold")),
                                         ("u3", row(uid="u3", account="Beta", tier="gold")))),
             # the middle table's row goes: its users are retracted through the join after it
             ((account("A", None),), (("u2", ""),)),
             ((plan_of("P2", None),), (("u1", ""), ("u3", ""))),
             # A's return and P2's, in one batch or two: each user once
             ((plan_of("P2", "platinum"), planned("A", "Acme", "P2")),
              (("u1", row(uid="u1", account="Beta", tier="platinum")),
               ("u2", row(uid="u2", account="Acme", tier="platinum")),
               ("u3", row(uid="u3", account="Beta", tier="platinum")))),
             # a NULL foreign key in the middle matches nothing
             ((("u3", None), planned("B", "Beta", None)), (("u1", ""), ("u3", ""))),
         ),
         joined=PLANS),
    Case("left_chain_of_foreign_keys",
         "uid STRING, accountId STRING",
         "uid STRING, accountId STRING, account STRING, tier STRING",
         "INSERT INTO out SELECT u.uid, u.accountId, a.name, p.tier FROM users u LEFT OUTER JOIN accounts a "
         "ON u.accountId = a.id LEFT JOIN plans p ON a.planId = p.id",
         (
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), user("u4", None), planned("A", "Acme", "P1"),
               plan_of("P1", "free")),
              (("u1", row(uid="u1", accountId="A", account="Acme", tier="free")),
               ("u2", row(uid="u2", accountId="A", account="Acme", tier="free")),
               ("u3", row(uid="u3", accountId="B", account=None, tier=None)),
               ("u4", row(uid="u4", accountId=None, account=None, tier=None)))),
             ((planned("B", "Beta", "P2"),), (("u3", row(uid="u3", accountId="B", account="Beta", tier=None)),)),
             ((plan_of("P2", "pro"),), (("u3", row(uid="u3", accountId="B", account="Beta", tier="pro")),)),
             ((planned("A", "Acme", "P2"),), (("u1", row(uid="u1", accountId="A", account="Acme", tier="pro")),
                                              ("u2", row(uid="u2", accountId="A", account="Acme", tier="pro")))),
             # the middle table's row goes: its users keep their row, with NULLs from it on
             ((account("A", None),), (("u1", row(uid="u1", accountId="A", account=None, tier=None)),
                                      ("u2", row(uid="u2", accountId="A", account=None, tier=None)))),
             ((user("u1", "B"),), (("u1", row(uid="u1", accountId="B", account="Beta", tier="pro")),)),
             ((plan_of("P2", None),), (("u1", row(uid="u1", accountId="B", account="Beta", tier=None)),
                                       ("u3", row(uid="u3", accountId="B", account="Beta", tier=None)))),
             # and a plan nobody's account references and a user never seen: nothing
             ((("u3", None), plan_of("P1", "free 2"), ("u9", None)), (("u3", ""),)),
             ((planned("A", "Acme", "P1"),), (("u2", row(uid="u2", accountId="A", account="Acme", tier="free 2")),)),
         ),
         joined=PLANS),
    Case("group_by_over_a_chain_of_foreign_keys",
         "uid STRING, accountId STRING",
         "tier STRING, users BIGINT",
         "INSERT INTO out SELECT COALESCE(p.tier, 'none'), COUNT(*) FROM users u LEFT JOIN accounts a "
         "ON u.accountId = a.id LEFT JOIN plans p ON a.planId = p.id GROUP BY COALESCE(p.tier, 'none')",
         (
             ((user("u1", "A"), user("u2", "A"), user("u3", "B"), planned("A", "Acme", "P1"),
               planned("B", "Beta", "P2"), plan_of("P1", "free")),
              (("free", row(tier="free", users=2)), ("none", row(tier="none", users=1)))),
             ((plan_of("P2", "pro"),), (("none", ""), ("pro", row(tier="pro", users=1)))),
             # the middle table's foreign key moves: its users move between groups
             ((planned("A", "Acme", "P2"),), (("free", ""), ("pro", row(tier="pro", users=3)))),
             ((account("B", None),), (("none", row(tier="none", users=1)), ("pro", row(tier="pro", users=2)))),
             ((("u1", None),), (("pro", row(tier="pro", users=1)),)),
         ),
         joined=PLANS),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_changelog_of_each_foreign_key_join(case, settings_factory, broker, spark):
    check_changelog(case, settings_factory, broker, spark)


def test_the_foreign_key_example_ends_with_each_user_and_their_accounts_row_now(settings_factory, broker, spark):
    # data/sql/users_with_their_account: a plan change, a user's move, a late account, an account's
    # and a user's delete; whatever the batches, the result ends the same
    topics = fresh_topics("users", "accounts", "users_with_their_account")
    plan = build_plan((SQL_DIR / "users_with_their_account.sql").read_text(), topics)
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        publish_samples(client, load_samples(SQL_DIR / "users_with_their_account.messages.jsonl", plan))
    finally:
        client.close()
    expected = [
        {"userUid": "100-2", "fullName": "alice", "accountId": "101", "accountName": None, "accountPlan": "none"},
        {"userUid": "101-1", "fullName": "carol", "accountId": "101", "accountName": None, "accountPlan": "none"},
        {"userUid": "102-1", "fullName": "dan", "accountId": "102", "accountName": "Initech", "accountPlan": "free"},
    ]
    settings = settings_factory(job__restart__delay="3s")
    with Running(settings, plan, "fk-example", spark) as running:
        current = wait_for(lambda: (rows := sorted(running.result(settings, "fk-example"), key=lambda r: r["userUid"]))
                           == expected and rows, 180, what="the example's result")
    assert current == expected
    on_topic = latest_per_key(read_topic(broker.service_url, topics["users_with_their_account"]))
    assert [on_topic[r["userUid"]] for r in expected] == expected and sorted(on_topic) == [r["userUid"] for r in expected]
