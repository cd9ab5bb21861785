"""``table.exec.state.ttl`` in the Java operators (Spark, no broker): what expires, and when.

Each test streams change rows from JSON files through one operator (pipeline/jvm/statefulstreams/)
and reads what each step emits. Flink's semantics (state TTL, OnCreateAndWrite, processing time):
a join side's row expires the TTL after it was last written, each side on its own; a group expires
whole the TTL after it was last updated; expiry emits nothing, and a later change of the key starts
from empty state. Steps wait on the clock (a deadline condition) so that a step's micro-batch
starts at a known distance from an earlier step's, which is all Spark's processing time is.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from pipeline import store
from pipeline.metrics import read_rows
from waiting import poll, wait_for

TTL_MS = 20_000  # long beside a loaded machine's batches (seconds apart): the steps' timings hold
JOIN_SCHEMA = "key STRING, side INT, op STRING, source_partition BIGINT, position BIGINT, s0_a STRING, s1_b STRING"
AGG_SCHEMA = "key STRING, group_key STRING, op STRING, g STRING, v BIGINT"


class Steps:
    """A streaming query over a folder of JSON files: :meth:`run` adds one file and returns the
    rows its micro-batch, and the batches without data Spark ran meanwhile (a TTL's processing-time
    mode runs one per trigger), emitted."""

    def __init__(self, spark, tmp_path: Path, schema: str, operator):
        from pyspark.sql import DataFrame

        self.folder, self.count, self.emitted = tmp_path / "in", 0, []
        self.folder.mkdir(parents=True)
        rows = spark.readStream.schema(schema).json(str(self.folder))
        out = DataFrame(operator(spark._jvm.statefulstreams, rows._jdf), spark)
        self.query = (out.writeStream.foreachBatch(lambda frame, _batch: self.emitted.extend(
                          r.asDict() for r in frame.collect()))
                      .option("checkpointLocation", str(tmp_path / "checkpoint"))
                      .trigger(processingTime="200 milliseconds").start())
        self.batch_ms = 0  # the processing time of the last step's batch (its start)

    def step_batch_ms(self) -> int | None:
        """The processing time of the committed batch that read the last step's file, if any."""
        if self.query.exception() is not None:
            raise AssertionError(f"the query failed: {self.query.exception()}")
        for progress in self.query.recentProgress:
            offset = progress["sources"][0]["endOffset"] if progress["sources"] else None
            offset = json.loads(offset) if isinstance(offset, str) else offset
            if offset and offset["logOffset"] + 1 >= self.count:
                stamp = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
                return int(stamp.timestamp() * 1000)
        return None

    def run(self, rows: list[dict], not_before_ms: int = 0) -> list[dict]:
        """Rows of one step, published once the clock reads ``not_before_ms`` (0: at once)."""
        wait_for(lambda: time.time() * 1000 >= not_before_ms, TTL_MS * 3 / 1000, 0.05, "the step's time")
        self.emitted.clear()
        self.count += 1
        staged = self.folder / f".step{self.count}.tmp"
        staged.write_text("".join(json.dumps(r) + "\n" for r in rows))
        staged.rename(self.folder / f"step{self.count}.json")
        self.batch_ms = wait_for(self.step_batch_ms, 120, 0.05, f"step {self.count}'s batch")
        return list(self.emitted)

    def stop(self) -> None:
        self.query.stop()


@pytest.fixture
def steps_of(spark, tmp_path):
    made = []

    def make(schema: str, operator) -> Steps:
        made.append(Steps(spark, tmp_path / f"q{len(made)}", schema, operator))
        return made[-1]

    yield make
    for steps in made:
        steps.stop()


def change(key: str, side: int, position: int, op: str = "upsert", **values) -> dict:
    return {"key": key, "side": side, "op": op, "source_partition": 0, "position": position, **values}


def joined(rows: list[dict]) -> list[tuple]:
    return sorted((r["key"], r["op"], r["s0_a"], r["s1_b"]) for r in rows)


def build_join(ttl_ms: int):
    def operator(jvm, rows):
        spec = (jvm.JoinSpec().key("key").side("side").op("op").sides([["s0_a"], ["s1_b"]])
                .readOrder(["source_partition", "position"]).emitBefore(False).stateTtlMs(ttl_ms))
        return jvm.UpsertJoin.apply(rows, spec)
    return operator


def test_a_join_side_not_written_for_the_ttl_is_dropped_on_its_own_and_nothing_is_sent(steps_of):
    steps = steps_of(JOIN_SCHEMA, build_join(TTL_MS))
    steps.run([change("warm-up", 0, 0, s0_a="w")])  # the first batch is the slow one
    # k1 and k2: both sides now, then only side 1 of k1 and side 0 of k2 written again; k3 and k4 never again
    assert joined(steps.run([change("k1", 0, 1, s0_a="a1"), change("k1", 1, 2, s1_b="b1"),
                             change("k2", 0, 3, s0_a="a2"), change("k2", 1, 4, s1_b="b2"),
                             change("k3", 0, 5, s0_a="a3"), change("k4", 0, 6, s0_a="a4"),
                             change("k4", 1, 7, s1_b="b4")])) == [
        ("k1", "after", "a1", "b1"), ("k2", "after", "a2", "b2"), ("k3", "after", "a3", None),
        ("k4", "after", "a4", "b4")]
    first = steps.batch_ms
    assert joined(steps.run([change("k1", 1, 8, s1_b="b1+"), change("k2", 0, 9, s0_a="a2+")],
                            not_before_ms=first + TTL_MS // 2)) == [
        ("k1", "after", "a1", "b1+"), ("k2", "after", "a2+", "b2")]
    second = steps.batch_ms
    # past the TTL of the first step's writes, not of the second's; expiry itself sent nothing
    third = steps.run([change("k1", 0, 10, s0_a="a1+"), change("k2", 1, 11, s1_b="b2+"),
                       change("k3", 0, 12, op="delete"), change("k4", 1, 13, s1_b="b4+")],
                      not_before_ms=first + TTL_MS + 300)
    assert steps.batch_ms < second + TTL_MS, "the machine took longer than TTL_MS / 2 to start a batch"
    assert joined(third) == [
        ("k1", "after", "a1+", "b1+"),  # k1's side 0 had expired; side 1, written since, is still there
        ("k2", "after", "a2+", "b2+")]  # k2's side 1 had expired and is written anew; side 0 stayed
    # k3: a delete of an expired driving row sends nothing (Flink's ChangelogNormalize has no state
    # for it); k4: a change of side 1 alone finds no driving row and sends nothing
    assert joined(steps.run([change("k4", 0, 14, s0_a="a4+")])) == [("k4", "after", "a4+", "b4+")]


def test_a_join_without_a_ttl_keeps_every_side(steps_of):
    steps = steps_of(JOIN_SCHEMA, build_join(0))
    steps.run([change("k1", 0, 1, s0_a="a1"), change("k1", 1, 2, s1_b="b1")])
    assert joined(steps.run([change("k1", 1, 3, s1_b="b1+")], not_before_ms=steps.batch_ms + 500)) == [
        ("k1", "after", "a1", "b1+")]


def build_aggregate(ttl_ms: int):
    def operator(jvm, rows):
        spec = (jvm.AggregateSpec().groupKey("group_key").member("key").op("op").groups(["g"])
                .aggregate("COUNT", "", "n").aggregate("SUM", "v", "total").stateTtlMs(ttl_ms))
        return jvm.GroupAggregate.apply(rows, spec)
    return operator


def member(key: str, group: str, value: int | None, op: str = "after") -> dict:
    return {"key": key, "group_key": group, "op": op, "g": group, "v": value}


def results(rows: list[dict]) -> list[tuple]:
    return sorted((r["g"], r["op"], r["n"], r["total"]) for r in rows)


def test_a_group_not_updated_for_the_ttl_restarts_from_empty_state(steps_of):
    steps = steps_of(AGG_SCHEMA, build_aggregate(TTL_MS))
    steps.run([member("w", "warm-up", 0)])  # the first batch is the slow one

    def run(rows, not_before_ms: int = 0) -> list[dict]:
        # the warm-up group expires too, in whichever step a slow machine reaches its TTL
        return [r for r in steps.run(rows, not_before_ms) if r["g"] != "warm-up"]

    assert results(run([member("m1", "g1", 1), member("m2", "g1", 2), member("m3", "g2", 3), member("m8", "g3", 8)])) \
        == [("g1", "upsert", 2, 3), ("g2", "upsert", 1, 3), ("g3", "upsert", 1, 8)]
    first = steps.batch_ms
    assert results(run([member("m4", "g2", 4)], not_before_ms=first + TTL_MS // 2)) == [("g2", "upsert", 2, 7)]
    second = steps.batch_ms
    # g1 was last updated more than the TTL ago: members and last result are gone, whole; its next
    # change counts from empty state (Flink: a new accumulator), and no delete is sent for it, only
    # an expire row (for HAVING's join; pipeline/sql/runner.py drops it otherwise). g2, updated
    # since, keeps every member. g3's delete finds no state and sends nothing.
    third = run([member("m5", "g1", 5), member("m6", "g2", 6), member("m8", "g3", 8, op="delete")],
                not_before_ms=first + TTL_MS + 300)
    assert steps.batch_ms < second + TTL_MS, "the machine took longer than TTL_MS / 2 to start a batch"
    assert results(r for r in third if r["op"] != "expire") == [("g1", "upsert", 1, 5), ("g2", "upsert", 3, 13)]
    # a group's expire row comes when its timer fires, in a batch without data before the step's
    # batch (and then before this step), or when its input arrives first
    assert set(results(r for r in third if r["op"] == "expire")) <= {("g1", "expire", 2, 3), ("g3", "expire", 1, 8)}
    assert results(run([member("m9", "g3", 9)])) == [("g3", "upsert", 1, 9)]


def test_a_group_without_a_ttl_keeps_every_member(steps_of):
    steps = steps_of(AGG_SCHEMA, build_aggregate(0))
    steps.run([member("m1", "g1", 1), member("m2", "g1", 2)])
    third = steps.run([member("m5", "g1", 5)], not_before_ms=steps.batch_ms + 500)
    assert results(third) == [("g1", "upsert", 3, 8)]



def test_havings_join_drops_a_groups_last_row_on_its_expire_row_and_sends_nothing(steps_of):
    # HAVING's UpsertJoin (pipeline/sql/runner.py apply_having) has no TTL of its own: emitBefore,
    # no read order; GroupAggregate's expire row drops the result row it keeps, so that the group's
    # next row comes with no "before" (pipeline/sql/sink.py resolve_changes then sends it only if it
    # passes HAVING, as Flink's filter over a new accumulator does)
    def operator(jvm, rows):
        spec = (jvm.JoinSpec().key("key").side("side").op("op").sides([["s0_a"]]).readOrder([])
                .emitBefore(True))
        return jvm.UpsertJoin.apply(rows, spec)

    steps = steps_of(JOIN_SCHEMA, operator)
    assert joined(steps.run([change("g1", 0, 0, s0_a="5"), change("g2", 0, 0, s0_a="7")])) == [
        ("g1", "after", "5", None), ("g2", "after", "7", None)]
    assert joined(steps.run([change("g1", 0, 0, op="expire", s0_a="5"), change("g1", 0, 0, s0_a="1"),
                             change("g2", 0, 0, op="expire", s0_a="7")])) == [("g1", "after", "1", None)]
    assert joined(steps.run([change("g1", 0, 0, s0_a="2"), change("g2", 0, 0, s0_a="3")])) == [
        ("g1", "after", "2", None), ("g1", "before", "1", None), ("g2", "after", "3", None)]


FK_SCHEMA = "key STRING, fk_key STRING, op STRING, source_partition BIGINT, position BIGINT, s0_a STRING, s1_b STRING"


def build_foreign_key_join(ttl_ms: int):
    def operator(jvm, rows):
        spec = (jvm.ForeignKeySpec().foreignKey("fk_key").key("key").op("op").driving(["s0_a"]).referenced(["s1_b"])
                .readOrder(["source_partition", "position"]).inner(False).stateTtlMs(ttl_ms))
        return jvm.ForeignKeyJoin.apply(rows, spec)
    return operator


def referencing(key: str, foreign: str, a: str, op: str = "after") -> dict:
    """A driving row's version (UpsertJoin's before or after), under its foreign key value."""
    return {"key": key, "fk_key": foreign, "op": op, "source_partition": 0, "position": 0, "s0_a": a}


def referenced(foreign: str, position: int, b: str) -> dict:
    return {"key": foreign, "fk_key": foreign, "op": "upsert", "source_partition": 0, "position": position, "s1_b": b}


def test_a_foreign_key_joins_referencing_and_referenced_rows_expire_each_on_its_own(steps_of):
    steps = steps_of(FK_SCHEMA, build_foreign_key_join(TTL_MS))
    steps.run([referencing("warm-up", "W", "w")])  # the first batch is the slow one
    assert joined(steps.run([referencing("k1", "F1", "a1"), referencing("k2", "F2", "a2"), referenced("F1", 1, "b1"),
                             referenced("F2", 2, "b2")])) == [("k1", "after", "a1", "b1"), ("k2", "after", "a2", "b2")]
    first = steps.batch_ms
    # F2 written again, k3 put under F1: both written half a TTL later than the first step's rows
    assert joined(steps.run([referenced("F2", 3, "b2+"), referencing("k3", "F1", "a3")],
                            not_before_ms=first + TTL_MS // 2)) == [
        ("k2", "after", "a2", "b2+"), ("k2", "before", "a2", "b2"), ("k3", "after", "a3", "b1")]
    second = steps.batch_ms
    # past the TTL of the first step's writes (F1 and k2), not of the second's (F2 and k3): a row
    # put under F1 now finds no referenced row (LEFT: NULLs); one put under F2 finds it
    third = steps.run([referencing("k4", "F1", "a4"), referencing("k5", "F2", "a5")],
                      not_before_ms=first + TTL_MS + 300)
    assert steps.batch_ms < second + TTL_MS, "the machine took longer than TTL_MS / 2 to start a batch"
    assert joined(third) == [("k4", "after", "a4", None), ("k5", "after", "a5", "b2+")]
    # F2's change updates the rows referencing it that have not expired: k5, not k2 (expiry itself sent nothing)
    assert joined(steps.run([referenced("F2", 4, "b2++")])) == [("k5", "after", "a5", "b2++"),
                                                                ("k5", "before", "a5", "b2+")]
    assert steps.batch_ms < second + TTL_MS, "the machine took longer than TTL_MS / 2 to start two batches"


def test_a_foreign_key_join_without_a_ttl_keeps_every_row(steps_of):
    steps = steps_of(FK_SCHEMA, build_foreign_key_join(0))
    steps.run([referencing("k1", "F1", "a1"), referenced("F1", 1, "b1")])
    assert joined(steps.run([referenced("F1", 2, "b1+")], not_before_ms=steps.batch_ms + 500)) == [
        ("k1", "after", "a1", "b1+"), ("k1", "before", "a1", "b1")]


TTL_SCRIPT = """SET 'table.exec.state.ttl' = '3 s';
CREATE TABLE users (uid STRING, accountId STRING, PRIMARY KEY (uid) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/users', 'key.format' = 'raw', 'value.format' = 'json');
CREATE TABLE counts (accountId STRING, n BIGINT, PRIMARY KEY (accountId) NOT ENFORCED) WITH (
 'connector' = 'upsert-pulsar', 'topic' = 'persistent://public/default/counts', 'key.format' = 'raw',
 'value.format' = 'json');
INSERT INTO counts SELECT accountId, COUNT(*) FROM users GROUP BY accountId;"""


@pytest.mark.e2e
def test_a_pipeline_with_a_state_ttl_counts_an_idle_group_anew_and_sends_nothing_on_expiry(settings_factory, broker,
                                                                                           spark):
    from factories import publish
    from pipeline.sql.plan import build_plan
    from sqlhelp import Running, TopicTail, fresh_topics, latest_per_key, message, sink_rows

    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("users", "counts")
    url = broker.service_url
    publish(url, topics["users"], [message("u1", {"uid": "u1", "accountId": "A"}),
                                   message("u2", {"uid": "u2", "accountId": "A"})])
    tail = TopicTail(url, topics["counts"])
    with Running(settings, build_plan(TTL_SCRIPT, topics), "ttl", spark) as running:
        def arrived(count: int):
            running.check()
            on_topic = tail.read()
            return len(on_topic) >= count and on_topic

        assert wait_for(lambda: arrived(1), 180, what="the first count") == [("A", '{"accountId":"A","n":2}')]
        seen_ms = time.time() * 1000  # after the batch that wrote the group: its TTL ends before seen + TTL
        wait_for(lambda: time.time() * 1000 >= seen_ms + 3500, 10, 0.05, "the group's TTL")
        publish(url, topics["users"], [message("u3", {"uid": "u3", "accountId": "A"})])
        # the group counts from empty state; no tombstone was sent when it expired
        on_topic = wait_for(lambda: arrived(2), 90, what="the count after the TTL")
        assert on_topic == [("A", '{"accountId":"A","n":2}'), ("A", '{"accountId":"A","n":1}')]
        current = running.result(settings, "ttl")
        # Then nothing comes. Spark would run a batch every trigger for the group's timer; the
        # source plans one batch of no row once the TTL has passed since the last input, whose
        # timer drops the group, and then none (runtime/spark.py ``timer_ticks``).
        progress = lambda: read_rows(store.sql_dir(settings.data_dir, "ttl"), "progress")  # noqa: E731
        last_read = max(row["batch_id"] for row in progress() if row["rows_in"])
        wait_for(lambda: [row for row in progress() if row["batch_id"] > last_read and row["state_rows"] == 0], 60,
                 what="a batch of no row that drops the expired group")
        quiet = poll(lambda: time.time() * 1000 - max(row["ts_ms"] for row in progress()) > 4_000, timeout=40)
        after = [row for row in progress() if row["batch_id"] > last_read]
        # The group written again (counted anew: it was dropped), and the pipeline stopped
        # before its TTL ends: it is idle.
        publish(url, topics["users"], [message("u4", {"uid": "u4", "accountId": "A"})])
        assert wait_for(lambda: arrived(3), 90, what="the count of the group written again")[-1] == \
            ("A", '{"accountId":"A","n":1}')
    assert current == [latest_per_key(on_topic)["A"]]
    assert quiet, "a batch every trigger with nothing to read"
    assert 1 <= len(after) <= 2 and all(row["rows_in"] == 0 for row in after), after
    # Restarted with nothing to read, the pipeline still drops the group once its TTL has passed
    # (the source counts the window from its own start), and then runs no batch.
    before_restart = max(row["batch_id"] for row in progress())
    with Running(settings, build_plan(TTL_SCRIPT, topics), "ttl", spark) as running:
        dropped = wait_for(lambda: running.check() or [row for row in progress() if row["batch_id"] > before_restart
                                                      and row["state_rows"] == 0], 60,
                           what="after a restart, a batch of no row that drops the expired group")
        quiet_again = poll(lambda: time.time() * 1000 - max(row["ts_ms"] for row in progress()) > 4_000, timeout=40)
        restarted = [row for row in progress() if row["batch_id"] > before_restart]
    assert dropped and quiet_again, "after a restart, a batch every trigger with nothing to read"
    assert 1 <= len(restarted) <= 2 and all(row["rows_in"] == 0 for row in restarted), restarted
    assert len(tail.read()) == 3, "the expiry sent nothing"
    # nor a delete in the result table: the expire row is dropped before the sink (runner.py), and
    # the sink refuses an op it does not send rather than drop it again
    changes = sorted(sink_rows(settings, "ttl", "result"), key=lambda r: r["_batch_id"])
    assert [(r["_key"], r["_op"], r["n"]) for r in changes] == [("A", "upsert", 2), ("A", "upsert", 1),
                                                                 ("A", "upsert", 1)]


FK_TTL_SCRIPT = """SET 'table.exec.state.ttl' = '3 s';
CREATE TABLE users (uid STRING, accountId STRING, PRIMARY KEY (uid) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/users', 'key.format' = 'raw', 'value.format' = 'json');
CREATE TABLE accounts (id STRING, name STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/accounts', 'key.format' = 'raw', 'value.format' = 'json');
CREATE TABLE named (uid STRING, account STRING, PRIMARY KEY (uid) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/named', 'key.format' = 'raw', 'value.format' = 'json');
INSERT INTO named SELECT u.uid, a.name FROM users u LEFT JOIN accounts a ON u.accountId = a.id;"""


@pytest.mark.e2e
def test_a_foreign_key_join_with_a_state_ttl_forgets_an_idle_referenced_row_and_sends_nothing_on_expiry(
        settings_factory, broker, spark):
    from factories import publish
    from pipeline.sql.plan import build_plan
    from sqlhelp import Running, TopicTail, fresh_topics, message

    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("users", "accounts", "named")
    url = broker.service_url
    publish(url, topics["users"], [message("u1", {"uid": "u1", "accountId": "A"})])
    publish(url, topics["accounts"], [message("A", {"id": "A", "name": "Acme"})])
    tail = TopicTail(url, topics["named"])
    with Running(settings, build_plan(FK_TTL_SCRIPT, topics), "fk-ttl", spark) as running:
        def arrived(count: int):
            running.check()
            on_topic = tail.read()
            return len(on_topic) >= count and on_topic

        first = wait_for(lambda: arrived(1), 180, what="the first joined row")
        assert first == [("u1", '{"uid":"u1","account":"Acme"}')]
        seen_ms = time.time() * 1000  # after the batch that wrote both rows: their TTL ends before seen + TTL
        wait_for(lambda: time.time() * 1000 >= seen_ms + 3500, 10, 0.05, "the rows' TTL")
        # u1's delete, read before u2: its row expired, so nothing is sent for it; u2 finds no account
        publish(url, topics["users"], [message("u1", None), message("u2", {"uid": "u2", "accountId": "A"})])
        on_topic = wait_for(lambda: arrived(2), 90, what="the joined row after the TTL")
        current = sorted(running.result(settings, "fk-ttl"), key=lambda r: r["uid"])
    assert on_topic == [("u1", '{"uid":"u1","account":"Acme"}'), ("u2", '{"uid":"u2","account":null}')]
    assert current == [{"uid": "u1", "account": "Acme"}, {"uid": "u2", "account": None}]
