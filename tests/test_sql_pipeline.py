"""The seed's two SQL pipelines end to end: real broker, real Spark, real Parquet and DuckDB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import duckdb
import pytest

from app.sql_queries import dead_letters, list_pipelines, pipeline_totals, result_changes
from factories import publish
from jobproc import cli_args
from pipeline.feed.broker import die_with_parent
from pipeline.sql.plan import build_plan
from sqlhelp import COUNT_SQL, JOIN_SQL, Running, fresh_topics, latest_per_key, message, read_topic, result
from waiting import wait_for

pytestmark = pytest.mark.e2e


class PipelineProcess:
    """``python -m pipeline sql …`` as a real process in its own group, for kill -9."""

    def __init__(self, settings, log_path, *args):
        self.log = open(log_path, "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")}
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", *cli_args(settings), "sql", *args],
                                     stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True, preexec_fn=die_with_parent)

    def result(self, settings, name: str, sink: str = "result") -> list[dict]:
        assert self.proc.poll() is None, f"the SQL pipeline exited with code {self.proc.returncode}"
        return result(settings, name, sink)

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=90)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftover Python workers, if any
        except ProcessLookupError:
            pass
        self.log.close()
        return code


def test_count_by_account_updates_moves_and_deletes_exactly_once(settings_factory, broker, spark):
    # kill -9 in the middle of a pipeline: test_sql_statement_set.py (the same count, beside a second INSERT)
    settings = settings_factory()
    topics = fresh_topics("users", "user_count_by_account")
    plan = build_plan(COUNT_SQL.read_text(), topics)
    url = broker.service_url
    # The seed's messages, unchanged: four creates and an update.
    publish(url, topics["users"], [
        message("100-1", {"uid": "100-1", "accountId": "100", "id": 1, "fullName": "bob", "op": "c"}),
        message("100-2", {"uid": "100-2", "accountId": "100", "id": 2, "fullName": "bob", "op": "c"}),
        message("101-1", {"uid": "101-1", "accountId": "101", "id": 1, "fullName": "bob", "op": "c"}),
        message("101-2", {"uid": "101-2", "accountId": "101", "id": 2, "fullName": "bob", "op": "c"}),
        message("100-1", {"uid": "100-1", "accountId": "100", "id": 1, "fullName": "bob", "op": "u"}),
    ])
    with Running(settings, plan, "count", spark) as running:
        expected = [{"accountId": "100", "userCount": 2}, {"accountId": "101", "userCount": 2}]
        wait_for(lambda: running.result(settings, "count") == expected, 180, what="the seed's counts")
        query = next(q for q in spark.streams.active if q.name == "sql-count")
        executed = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        assert "MapInArrow" not in executed  # the source's read tasks parse: no Python stage after the read
        # Move 100-1 to account 101, and a string where an INT is declared (the seed's Flink job crashed on it).
        publish(url, topics["users"], [
            message("100-1", {"uid": "100-1", "accountId": "101", "id": 1, "fullName": "bob", "op": "u"}),
            message("100-9", {"uid": "100-9", "accountId": "100", "id": "nine", "fullName": "bad", "op": "c"}),
        ])
        wait_for(lambda: running.result(settings, "count") == [{"accountId": "100", "userCount": 1},
                                                               {"accountId": "101", "userCount": 3}], 90,
                 what="the move")
        # Delete account 100's last user: its count goes, and a tombstone tells the topic.
        publish(url, topics["users"], [message("100-2", None)])
        wait_for(lambda: running.result(settings, "count") == [{"accountId": "101", "userCount": 3}], 90,
                 what="the delete")
    with duckdb.connect() as con:
        changes = result_changes(con, settings.data_dir, "count")
        dead = dead_letters(con, settings.data_dir, "count").to_dict("records")
        totals = pipeline_totals(con, settings.data_dir, "count")
    assert not changes.duplicated(["_key", "_batch_id"]).any()  # each committed batch once
    assert [(d["key"], d["error"]) for d in dead] == [
        ("100-9", "table 'users' column 'id': expected INT, got string \"nine\"")]
    on_topic = read_topic(url, topics["user_count_by_account"])
    assert latest_per_key(on_topic) == {"101": {"accountId": "101", "userCount": 3}}
    assert ("100", "") in on_topic  # account 100's tombstone
    assert ("101", '{"accountId":"101","userCount":3}') in on_topic  # the seed's JSON
    assert totals["batches"] >= 3 and totals["dead_letters"] == 1 and totals["rows_out"] >= 4
    assert [p["name"] for p in list_pipelines(settings.data_dir)] == ["count"]


STATS_SQL = """
CREATE TABLE users (uid STRING, accountId STRING, id INT, score DOUBLE, PRIMARY KEY (uid) NOT ENFORCED)
WITH ('connector' = 'upsert-pulsar', 'topic' = 'persistent://public/default/users', 'key.format' = 'raw',
      'value.format' = 'json');
CREATE TABLE account_stats (accountId STRING, users BIGINT, idSum BIGINT, idMin INT, idMax INT, scoreSum DOUBLE,
      PRIMARY KEY (accountId) NOT ENFORCED)
WITH ('connector' = 'upsert-pulsar', 'topic' = 'persistent://public/default/account_stats', 'key.format' = 'raw',
      'value.format' = 'json');
INSERT INTO account_stats SELECT accountId, COUNT(*), SUM(id), MIN(id), MAX(id), SUM(score) FROM users GROUP BY accountId;
"""
STATS = ["accountId", "users", "idSum", "idMin", "idMax", "scoreSum"]


def stats_user(uid: str, account: str, id_: int, score: float | None = None) -> tuple[str, bytes]:
    return message(uid, {"uid": uid, "accountId": account, "id": id_, **({"score": score} if score is not None else {})})


def test_three_way_left_join_and_sum_min_max_side_by_side(settings_factory, broker, spark):
    settings = settings_factory(job__restart__delay="3s")  # rides out a loaded machine
    topics = fresh_topics("users", "user_favorite_color", "user_favorite_cheese", "user_favorite_color_and_cheese")
    plan = build_plan(JOIN_SQL.read_text(), topics)
    stats_topics = fresh_topics("users", "account_stats")
    url = broker.service_url
    columns = ["accountId", "userUid", "favoriteColor", "favoriteCheese"]
    publish(url, stats_topics["users"], [stats_user("u1", "A", 5, 1.5), stats_user("u2", "A", 9, 2.0),
                                         stats_user("u3", "A", 7), stats_user("u4", "B", 1)])
    with Running(settings, plan, "join", spark) as running, \
            Running(settings, build_plan(STATS_SQL, stats_topics), "stats", spark) as stats:
        # The seed's messages, unchanged, one side at a time so that each shows in the output.
        steps = [
            ("users", message("103-1", {"uid": "103-1", "accountId": "103", "id": 1, "fullName": "bob", "op": "c"}),
             ["103", "103-1", None, None]),
            ("user_favorite_color", message("103-1", {"userUid": "103-1", "favoriteColor": "blue", "op": "c"}),
             ["103", "103-1", "blue", None]),
            ("user_favorite_cheese", message("103-1", {"userUid": "103-1", "favoriteCheese": "cheddar", "op": "c"}),
             ["103", "103-1", "blue", "cheddar"]),
            ("user_favorite_cheese", message("103-1", {"userUid": "103-1", "favoriteCheese": "brie", "op": "u"}),
             ["103", "103-1", "blue", "brie"]),
        ]
        for table, msg, row in steps:
            publish(url, topics[table], [msg])
            wait_for(lambda: running.result(settings, "join") == [dict(zip(columns, row))], 180 if table == "users" else 90, what=f"{table} {row}")
        # A side that arrives before its user; then the user; then 103-1 is deleted.
        publish(url, topics["user_favorite_color"], [message("104-1", {"userUid": "104-1", "favoriteColor": "red"})])
        publish(url, topics["users"], [message("104-1", {"uid": "104-1", "accountId": "104", "id": 1, "fullName": "al"}),
                                       message("103-1", None)])
        wait_for(lambda: running.result(settings, "join") == [dict(zip(columns, ["104", "104-1", "red", None]))], 90,
                 what="104-1 joined and 103-1 deleted")
        wait_for(lambda: stats.result(settings, "stats") == [dict(zip(STATS, ["A", 3, 21, 5, 9, 3.5])),
                                                             dict(zip(STATS, ["B", 1, 1, 1, 1, None]))], 90,
                 what="COUNT, SUM, MIN and MAX per account")
        # The maximum leaves for B and the minimum is deleted: both are retracted from A.
        publish(url, stats_topics["users"], [stats_user("u2", "B", 9, 2.0), message("u1", None)])
        wait_for(lambda: stats.result(settings, "stats") == [dict(zip(STATS, ["A", 1, 7, 7, 7, None])),
                                                             dict(zip(STATS, ["B", 2, 10, 1, 9, 2.0]))], 90,
                 what="SUM, MIN and MAX after the move and the delete")
    on_topic = read_topic(url, topics["user_favorite_color_and_cheese"])
    seed_output = [
        '{"accountId":"103","userUid":"103-1","favoriteColor":null,"favoriteCheese":null}',
        '{"accountId":"103","userUid":"103-1","favoriteColor":"blue","favoriteCheese":null}',
        '{"accountId":"103","userUid":"103-1","favoriteColor":"blue","favoriteCheese":"cheddar"}',
        '{"accountId":"103","userUid":"103-1","favoriteColor":"blue","favoriteCheese":"brie"}',
    ]
    assert [payload for key, payload in on_topic if key == "103-1"] == seed_output + [""]
    assert latest_per_key(on_topic) == {"104-1": dict(zip(columns, ["104", "104-1", "red", None]))}
