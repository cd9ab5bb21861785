"""A statement set (several INSERTs in one script) end to end: one query, each source message read
once, every INSERT's changelog exact, and exactly once through kill -9 in the middle of the set."""

from __future__ import annotations

import json
import signal

import duckdb
import pytest

from app.sql_queries import dead_letters, list_pipelines, pipeline_totals, result_changes
from factories import publish
from pipeline.sql.script import build_pipeline
from sqlhelp import SQL_DIR, Running, TopicTail, fresh_topics, latest_per_key, message, read_topic, result
from test_sql_pipeline import PipelineProcess
from waiting import wait_for

pytestmark = pytest.mark.e2e

SET_SQL = SQL_DIR / "account_counts_and_named_users.sql"
TABLES = ("users", "user_count_by_account", "user_names")
COUNTS, NAMED = "result_user_count_by_account", "result_user_names"


def user(uid: str, account: str, name: str | None = None, id_: int | str = 1) -> tuple[str, bytes]:
    return message(uid, {"uid": uid, "accountId": account, "id": id_, **({"fullName": name} if name else {})})


def row(**values) -> str:
    return json.dumps(values, separators=(",", ":"))


def test_a_statement_set_reads_each_message_once_and_writes_each_inserts_changelog(settings_factory, broker, spark):
    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics(*TABLES)
    plans = build_pipeline(SET_SQL.read_text(), topics)
    url = broker.service_url
    # a bad message of the table both INSERTs read: one dead letter, not one per INSERT
    publish(url, topics["users"], [user("u1", "A", "al"), user("u2", "A"), user("u3", "B", "cy"),
                                   user("u9", "B", "bad", id_="nine")])
    counts_tail, named_tail = TopicTail(url, topics["user_count_by_account"]), TopicTail(url, topics["user_names"])
    with Running(settings, plans, "set", spark) as running:
        def both(counts, named):
            def arrived():
                running.check()
                on_counts, on_named = counts_tail.read(), named_tail.read()
                return len(on_counts) >= counts and len(on_named) >= named and (on_counts, on_named)
            return arrived

        on_counts, on_named = wait_for(both(2, 2), 180, what="the set's first batch")
        assert sorted(on_counts) == [("A", row(accountId="A", userCount=2)), ("B", row(accountId="B", userCount=1))]
        assert sorted(on_named) == [("u1", row(uid="u1", accountId="A", name="AL")),
                                    ("u3", row(uid="u3", accountId="B", name="CY"))]
        query = next(q for q in spark.streams.active if q.name == "sql-set")
        executed = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        assert "ReusedExchange" in executed  # the second INSERT reads the first one's read of the source
        assert "MapInArrow" in executed  # each INSERT parses its own envelope after the shared read
        # u2 gets a name (counts unchanged: nothing sent there); u1 is deleted (both change)
        publish(url, topics["users"], [user("u2", "A", "bo")])
        on_counts, on_named = wait_for(both(2, 3), 90, what="u2 named")
        publish(url, topics["users"], [message("u1", None)])
        on_counts, on_named = wait_for(both(3, 4), 90, what="u1 deleted")
        assert on_counts[2:] == [("A", row(accountId="A", userCount=1))]
        assert on_named[2:] == [("u2", row(uid="u2", accountId="A", name="BO")), ("u1", "")]
        assert result(settings, "set", COUNTS) == [{"accountId": "A", "userCount": 1}, {"accountId": "B", "userCount": 1}]
        assert result(settings, "set", NAMED) == [{"uid": "u2", "accountId": "A", "name": "BO"},
                                                  {"uid": "u3", "accountId": "B", "name": "CY"}]
    with duckdb.connect() as con:
        dead = dead_letters(con, settings.data_dir, "set")
    assert [(d["key"], d["error"]) for d in dead.to_dict("records")] == [
        ("u9", "table 'users' column 'id': expected INT, got string \"nine\"")]


def test_kill_9_in_the_middle_of_a_statement_set_loses_and_duplicates_nothing(settings_factory, broker, tmp_path):
    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics(*TABLES)
    args = [str(SET_SQL), "--name", "set9"] + [f"--topic={t}={topic}" for t, topic in topics.items()]
    url = broker.service_url
    users = {f"u{i}": (f"A{i % 7}", f"n{i}" if i % 3 else None) for i in range(120)}
    first = PipelineProcess(settings, tmp_path / "first.log", *args)
    try:
        # account Z's users go after the crash (its count's tombstone); u-bad is one dead letter, once
        publish(url, topics["users"], [user(uid, *value) for uid, value in list(users.items())[:40]]
                + [user("z1", "Z", "zed"), user("z2", "Z"), user("u-bad", "A0", "bad", id_="nine")])
        wait_for(lambda: len(first.result(settings, "set9", NAMED)) > 0, 180, what="the set's first commit")
        # more work in flight, then kill -9 while the set's batches run
        publish(url, topics["users"], [user(uid, *value) for uid, value in list(users.items())[40:80]])
        wait_for(lambda: read_topic(url, topics["user_count_by_account"], timeout_ms=200), 90, what="a count sent")
    finally:
        first.kill9()
    # moves and deletes after the crash, read by the restarted set from its checkpoint
    moved = {f"u{i}": ("B", f"m{i}") for i in range(0, 120, 5)}
    deleted = [f"u{i}" for i in range(1, 120, 11)]
    publish(url, topics["users"], [user(uid, *value) for uid, value in list(users.items())[80:]]
            + [user(uid, *value) for uid, value in moved.items()] + [message(uid, None) for uid in deleted]
            + [message("z1", None), message("z2", None)])
    users.update(moved)
    for uid in deleted:
        users.pop(uid)
    counts: dict[str, int] = {}
    for account, _ in users.values():
        counts[account] = counts.get(account, 0) + 1
    expected_counts = {a: {"accountId": a, "userCount": n} for a, n in counts.items()}
    expected_named = {uid: {"uid": uid, "accountId": a, "name": name.upper()} for uid, (a, name) in users.items() if name}
    second = PipelineProcess(settings, tmp_path / "second.log", *args)
    try:
        wait_for(lambda: {r["accountId"]: r for r in second.result(settings, "set9", COUNTS)} == expected_counts
                 and {r["uid"]: r for r in second.result(settings, "set9", NAMED)} == expected_named, 240,
                 what="both results after kill -9")
    finally:
        assert second.stop() in (0, -signal.SIGTERM)
    # the upsert topics' final changelog: every key's last message is its row, no key left over
    on_counts = read_topic(url, topics["user_count_by_account"])
    assert latest_per_key(on_counts) == expected_counts
    assert ("Z", "") in on_counts  # the emptied account's tombstone
    assert latest_per_key(read_topic(url, topics["user_names"])) == expected_named
    with duckdb.connect() as con:
        for sink in (COUNTS, NAMED):
            changes = result_changes(con, settings.data_dir, "set9", sink)
            assert not changes.duplicated(["_key", "_batch_id"]).any(), sink  # each committed batch once
        dead = dead_letters(con, settings.data_dir, "set9")
        totals = pipeline_totals(con, settings.data_dir, "set9")
    assert [(d["key"], d["error"]) for d in dead.to_dict("records")] == [
        ("u-bad", "table 'users' column 'id': expected INT, got string \"nine\"")]
    assert totals["dead_letters"] <= 1  # progress rows are appended after a commit: kill -9 may cost one
    assert [p["name"] for p in list_pipelines(settings.data_dir)] == ["set9"]
