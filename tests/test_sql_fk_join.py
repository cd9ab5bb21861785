"""Foreign-key joins (``ON u.accountId = a.id``), LEFT and INNER, end to end, table-driven as
tests/test_sql_semantics.py: each step's exact changelog on the upsert topic and the current result.

A step of one message is one micro-batch, so a driving row that moves from one account to another
gets its retraction (from the old account) and its new row (from the new one) in the same batch:
the topic must show only the new row.
"""

from __future__ import annotations

import pytest

from test_sql_semantics import Case, check_changelog, row

pytestmark = pytest.mark.e2e

ACCOUNTS = (("accounts", "id STRING, name STRING", "id"),)


def user(uid: str, account: str | None) -> tuple:
    return (uid, {"uid": uid, "accountId": account} if account else {"uid": uid})


def account(key: str, name: str | None) -> tuple:
    return ("accounts", key, {"id": key, "name": name} if name else None)


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
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_changelog_of_each_foreign_key_join(case, settings_factory, broker, spark):
    check_changelog(case, settings_factory, broker, spark)
