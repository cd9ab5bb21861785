"""The seed's two SQL pipelines end to end: real broker, real Spark, real Parquet and DuckDB."""

from __future__ import annotations

import threading

import duckdb
import pytest

from app.sql_queries import current_result, dead_letters, list_pipelines, pipeline_totals
from factories import publish
from pipeline.sql.plan import build_plan
from pipeline.sql.runner import run_sql_pipeline
from sqlhelp import COUNT_SQL, JOIN_SQL, fresh_topics, latest_per_key, message, read_topic
from waiting import wait_for

pytestmark = pytest.mark.e2e


class Running:
    """A pipeline on the shared SparkSession in a thread; stopped (and its error re-raised) on exit."""

    def __init__(self, settings, plan, name, spark):
        self.stop, self.error = threading.Event(), []
        self.thread = threading.Thread(target=self._run, args=(settings, plan, name, spark), daemon=True)

    def _run(self, settings, plan, name, spark):
        try:
            run_sql_pipeline(settings, plan, name, stop=self.stop, spark=spark)
        except BaseException as exc:  # handed to the test thread
            self.error.append(exc)

    def __enter__(self):
        self.thread.start()
        return self

    def result(self, settings, name: str) -> list[dict]:
        """The current result; the pipeline's own error, at once, if it stopped."""
        if self.error:
            raise self.error[0]
        return result(settings, name)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the SQL pipeline did not stop"
        if self.error and not exc[0]:
            raise self.error[0]


def result(settings, name: str) -> list[dict]:
    with duckdb.connect() as con:
        return current_result(con, settings.data_dir, name).to_dict("records")


def test_count_by_account_updates_moves_and_deletes(settings_factory, broker, spark):
    settings = settings_factory()
    topics = fresh_topics("users", "user_count_by_account")
    plan = build_plan(COUNT_SQL.read_text(), topics)
    url = broker.service_url
    with Running(settings, plan, "count", spark) as running:
        # The seed's messages, unchanged: four creates and an update.
        publish(url, topics["users"], [
            message("100-1", {"uid": "100-1", "accountId": "100", "id": 1, "fullName": "bob", "op": "c"}),
            message("100-2", {"uid": "100-2", "accountId": "100", "id": 2, "fullName": "bob", "op": "c"}),
            message("101-1", {"uid": "101-1", "accountId": "101", "id": 1, "fullName": "bob", "op": "c"}),
            message("101-2", {"uid": "101-2", "accountId": "101", "id": 2, "fullName": "bob", "op": "c"}),
            message("100-1", {"uid": "100-1", "accountId": "100", "id": 1, "fullName": "bob", "op": "u"}),
        ])
        expected = [{"accountId": "100", "userCount": 2}, {"accountId": "101", "userCount": 2}]
        wait_for(lambda: running.result(settings, "count") == expected, 180, what="the seed's counts")
        # Move 100-1 to account 101, a string where an INT is declared, then delete account 100's last user.
        publish(url, topics["users"], [
            message("100-1", {"uid": "100-1", "accountId": "101", "id": 1, "fullName": "bob", "op": "u"}),
            message("100-9", {"uid": "100-9", "accountId": "100", "id": "nine", "fullName": "bad", "op": "c"}),
        ])
        wait_for(lambda: running.result(settings, "count") == [{"accountId": "100", "userCount": 1},
                                                       {"accountId": "101", "userCount": 3}], 90, what="the move")
        publish(url, topics["users"], [message("100-2", None)])
        wait_for(lambda: running.result(settings, "count") == [{"accountId": "101", "userCount": 3}], 90, what="the delete")
        assert running.thread.is_alive()
    on_topic = read_topic(url, topics["user_count_by_account"])
    assert latest_per_key(on_topic) == {"101": {"accountId": "101", "userCount": 3}}
    assert on_topic[-1] == ("100", "") or ("100", "") in on_topic  # account 100's tombstone
    assert ("101", '{"accountId":"101","userCount":3}') in on_topic  # the seed's JSON shape
    with duckdb.connect() as con:
        dead = dead_letters(con, settings.data_dir, "count").to_dict("records")
        totals = pipeline_totals(con, settings.data_dir, "count")
    assert [(d["key"], d["error"]) for d in dead] == [
        ("100-9", "table 'users' column 'id': expected INT, got string \"nine\"")]
    assert totals["rows_in"] == 8 and totals["dead_letters"] == 1 and totals["rows_out"] >= 3
    assert [p["name"] for p in list_pipelines(settings.data_dir)] == ["count"]


def test_three_way_left_join_reemits_on_every_side(settings_factory, broker, spark):
    settings = settings_factory()
    topics = fresh_topics("users", "user_favorite_color", "user_favorite_cheese", "user_favorite_color_and_cheese")
    plan = build_plan(JOIN_SQL.read_text(), topics)
    url = broker.service_url
    columns = ["accountId", "userUid", "favoriteColor", "favoriteCheese"]
    with Running(settings, plan, "join", spark) as running:
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
    on_topic = read_topic(url, topics["user_favorite_color_and_cheese"])
    seed_output = [
        '{"accountId":"103","userUid":"103-1","favoriteColor":null,"favoriteCheese":null}',
        '{"accountId":"103","userUid":"103-1","favoriteColor":"blue","favoriteCheese":null}',
        '{"accountId":"103","userUid":"103-1","favoriteColor":"blue","favoriteCheese":"cheddar"}',
        '{"accountId":"103","userUid":"103-1","favoriteColor":"blue","favoriteCheese":"brie"}',
    ]
    assert [payload for key, payload in on_topic if key == "103-1"] == seed_output + [""]
    assert latest_per_key(on_topic) == {"104-1": dict(zip(columns, ["104", "104-1", "red", None]))}
