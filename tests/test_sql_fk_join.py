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
