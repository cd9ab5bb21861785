"""Table-driven semantics of WHERE, expressions, GROUP BY on two columns, AVG and HAVING, end to end.

Each case is a statement, the messages (keys, payloads, tombstones) published step by step, and the
exact changelog each step adds to the upsert topic. The first step is published before the pipeline
starts, so it is read in one micro-batch; later steps are one message each (or touch keys that do
not share a result row), so the changelog does not depend on how the source cuts batches. Within a
step, the order of messages of different keys is the batch's, so a step's messages compare sorted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulsar
import pytest

from factories import publish
from pipeline.sql.plan import build_plan
from sqlhelp import Running, TopicTail, fresh_topics, latest_per_key, message
from waiting import wait_for

pytestmark = pytest.mark.e2e

TABLE = """CREATE TABLE {name} ({columns}, PRIMARY KEY ({key}) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', 'value.format' = 'json');"""


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # the users table's columns
    target: str  # the target table's columns (its key first)
    insert: str
    # ((message, …), (changelog entry, …)): a message is ([table,] key, record or None for a tombstone);
    # the table is users unless named; with_metadata(…) is a users message with properties and an event time
    steps: tuple
    joined: tuple[tuple[str, str, str], ...] = ()  # other tables: (name, columns, primary key)

    def sql(self) -> str:
        tables = [TABLE.format(name=name, columns=columns, key=key) for name, columns, key in self.joined]
        return "\n".join([TABLE.format(name="users", columns=self.source, key="uid"), *tables,
                          TABLE.format(name="out", columns=self.target, key=self.target.split()[0]), self.insert + ";"])


def with_metadata(key: str, record: dict, properties: dict | None, event_time_ms: int) -> tuple:
    """A users message sent with properties and an event time."""
    return ("users", key, record, {"properties": properties, "event_time": event_time_ms})


def publish_with_metadata(url: str, topic: str, key: str, record: dict, metadata: dict) -> None:
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(message(key, record)[1], partition_key=key, properties=metadata["properties"] or {},
                      event_timestamp=metadata["event_time"])
    finally:
        client.close()


def row(**values) -> str:
    return json.dumps(values, separators=(",", ":"))


CASES = [
    Case("where_and_expressions_on_a_projection",
         "uid STRING, accountId STRING, id INT, fullName STRING",
         "uid STRING, name STRING, tenfold INT, tier STRING",
         "INSERT INTO out SELECT uid, UPPER(fullName) || '@' || accountId, id * 10, "
         "CASE WHEN id >= 5 THEN 'gold' ELSE 'basic' END FROM users WHERE id >= 2 AND fullName IS NOT NULL",
         (
             # u1 does not match: nothing; u2 does
             ((("u1", {"uid": "u1", "accountId": "A", "id": 1, "fullName": "bob"}),
               ("u2", {"uid": "u2", "accountId": "A", "id": 2, "fullName": "al"})),
              (("u2", row(uid="u2", name="AL@A", tenfold=20, tier="basic")),)),
             # u2's new version stops matching: its row is retracted
             ((("u2", {"uid": "u2", "accountId": "A", "id": 0, "fullName": "al"}),), (("u2", ""),)),
             # u1's new version starts matching: it appears
             ((("u1", {"uid": "u1", "accountId": "B", "id": 5, "fullName": "bob"}),),
              (("u1", row(uid="u1", name="BOB@B", tenfold=50, tier="gold")),)),
             # a NULL makes the condition NULL, which is not TRUE: retracted
             ((("u1", {"uid": "u1", "accountId": "B", "id": 5}),), (("u1", ""),)),
             # a tombstone of a key not in the result (u2 stopped matching) sends nothing; u4 matches
             ((("u2", None), ("u4", {"uid": "u4", "accountId": "C", "id": 3, "fullName": "cy"})),
              (("u4", row(uid="u4", name="CY@C", tenfold=30, tier="basic")),)),
         )),
    Case("where_in_front_of_a_group_by_with_avg",
         "uid STRING, accountId STRING, id INT, active BOOLEAN",
         "accountId STRING, users BIGINT, avgId INT, tenfold BIGINT",
         "INSERT INTO out SELECT accountId, COUNT(*), AVG(id), SUM(id * 10) FROM users WHERE active GROUP BY accountId",
         (
             ((("u1", {"uid": "u1", "accountId": "A", "id": 1, "active": True}),
               ("u2", {"uid": "u2", "accountId": "A", "id": 4, "active": True}),
               ("u3", {"uid": "u3", "accountId": "B", "id": 2, "active": False})),
              (("A", row(accountId="A", users=2, avgId=2, tenfold=50)),)),  # Flink: AVG of INTs is an INT
             # u2 stops matching: decremented
             ((("u2", {"uid": "u2", "accountId": "A", "id": 4, "active": False}),),
              (("A", row(accountId="A", users=1, avgId=1, tenfold=10)),)),
             # u3 starts matching: counted
             ((("u3", {"uid": "u3", "accountId": "B", "id": 2, "active": True}),),
              (("B", row(accountId="B", users=1, avgId=2, tenfold=20)),)),
             # u1 moves to B: A is left empty and deleted
             ((("u1", {"uid": "u1", "accountId": "B", "id": 1, "active": True}),),
              (("A", ""), ("B", row(accountId="B", users=2, avgId=1, tenfold=30)))),
             ((("u3", None),), (("B", row(accountId="B", users=1, avgId=1, tenfold=10)),)),
         )),
    Case("group_by_an_expression_and_a_column_with_having",
         "uid STRING, accountId STRING, region STRING, score DOUBLE",
         "k STRING, n BIGINT, top DOUBLE, mean DOUBLE",
         "INSERT INTO out SELECT UPPER(accountId) || '/' || region, COUNT(*), MAX(score), AVG(score) FROM users "
         "GROUP BY UPPER(accountId), region HAVING COUNT(*) >= 2",
         (
             # A/us does not pass HAVING: nothing is sent for it, now or when it empties
             ((("u1", {"uid": "u1", "accountId": "a", "region": "eu", "score": 1.0}),
               ("u2", {"uid": "u2", "accountId": "a", "region": "eu", "score": 3.0}),
               ("u3", {"uid": "u3", "accountId": "a", "region": "us", "score": 2.0})),
              (("A/eu", row(k="A/eu", n=2, top=3.0, mean=2.0)),)),
             ((("u3", {"uid": "u3", "accountId": "a", "region": "eu", "score": 2.0}),),
              (("A/eu", row(k="A/eu", n=3, top=3.0, mean=2.0)),)),
             # the maximum is deleted: retracted
             ((("u2", None),), (("A/eu", row(k="A/eu", n=2, top=2.0, mean=1.5)),)),
             # the group stops passing HAVING: retracted, once
             ((("u1", None),), (("A/eu", ""),)),
             ((("u3", None),), ()),
             # a group that starts passing appears
             ((("u4", {"uid": "u4", "accountId": "b", "region": "us", "score": 5.0}),), ()),
             ((("u5", {"uid": "u5", "accountId": "b", "region": "us", "score": 7.0}),),
              (("B/us", row(k="B/us", n=2, top=7.0, mean=6.0)),)),
         )),
    Case("count_distinct",
         "uid STRING, accountId STRING, region STRING",
         "accountId STRING, regions BIGINT, located BIGINT",
         "INSERT INTO out SELECT accountId, COUNT(DISTINCT region), COUNT(region) FROM users GROUP BY accountId",
         (
             ((("u1", {"uid": "u1", "accountId": "A", "region": "eu"}),
               ("u2", {"uid": "u2", "accountId": "A", "region": "eu"}),
               ("u3", {"uid": "u3", "accountId": "A", "region": "us"})),
              (("A", row(accountId="A", regions=2, located=3)),)),
             ((("u3", {"uid": "u3", "accountId": "A", "region": "eu"}),),
              (("A", row(accountId="A", regions=1, located=3)),)),
             # a NULL is not counted: the result is unchanged, so nothing is sent
             ((("u4", {"uid": "u4", "accountId": "A"}),), ()),
             ((("u4", {"uid": "u4", "accountId": "A", "region": "asia"}),),
              (("A", row(accountId="A", regions=2, located=4)),)),
             # one of three eu rows leaves: eu is still counted once
             ((("u1", None),), (("A", row(accountId="A", regions=2, located=3)),)),
             ((("u4", None),), (("A", row(accountId="A", regions=1, located=2)),)),
         )),
    Case("where_on_a_left_joins_driving_table",
         "uid STRING, accountId STRING, id INT",
         "uid STRING, color STRING",
         "INSERT INTO out SELECT u.uid, COALESCE(c.color, 'none') || '/' || u.accountId FROM users u "
         "LEFT JOIN colors c ON u.uid = c.userUid WHERE u.id > 0",
         (
             ((("u1", {"uid": "u1", "accountId": "A", "id": 1}), ("u2", {"uid": "u2", "accountId": "A", "id": 0}),
               ("colors", "u1", {"userUid": "u1", "color": "red"})),
              (("u1", row(uid="u1", color="red/A")),)),
             ((("colors", "u2", {"userUid": "u2", "color": "blue"}),), ()),
             # u2 starts matching, with the side that waited for it
             ((("u2", {"uid": "u2", "accountId": "B", "id": 2}),), (("u2", row(uid="u2", color="blue/B")),)),
             ((("colors", "u1", None),), (("u1", row(uid="u1", color="none/A")),)),
             ((("u1", {"uid": "u1", "accountId": "A", "id": -1}),), (("u1", ""),)),
         ),
         joined=(("colors", "userUid STRING, color STRING", "userUid"),)),
    Case("where_on_a_joined_tables_column",
         "uid STRING, accountId STRING, id INT",
         "uid STRING, color STRING",
         "INSERT INTO out SELECT u.uid, c.color FROM users u LEFT JOIN colors c ON u.uid = c.userUid "
         "WHERE u.id > 0 AND (c.color IS NULL OR c.color <> 'red')",
         (
             ((("u1", {"uid": "u1", "accountId": "A", "id": 1}), ("colors", "u1", {"userUid": "u1", "color": "blue"}),
               ("u2", {"uid": "u2", "accountId": "A", "id": 1}), ("colors", "u2", {"userUid": "u2", "color": "red"})),
              (("u1", row(uid="u1", color="blue")),)),
             # the joined side's change makes u2 match, then u1 stop matching: it is retracted
             ((("colors", "u2", {"userUid": "u2", "color": "green"}),), (("u2", row(uid="u2", color="green")),)),
             ((("colors", "u1", {"userUid": "u1", "color": "red"}),), (("u1", ""),)),
             # a change of a key that matched neither before nor now sends nothing
             ((("u1", {"uid": "u1", "accountId": "B", "id": 1}),), ()),
             ((("colors", "u2", None),), (("u2", row(uid="u2", color=None)),)),
             # the driving table's conjunct, before the join
             ((("u2", {"uid": "u2", "accountId": "A", "id": 0}),), (("u2", ""),)),
             ((("colors", "u1", None),), (("u1", row(uid="u1", color=None)),)),
         ),
         joined=(("colors", "userUid STRING, color STRING", "userUid"),)),
    Case("inner_join_with_a_side_that_comes_late_goes_and_comes_back",
         "uid STRING, accountId STRING",
         "uid STRING, color STRING, cheese STRING",
         "INSERT INTO out SELECT u.uid, c.color, COALESCE(h.cheese, 'none') FROM users u "
         "JOIN colors c ON u.uid = c.userUid LEFT OUTER JOIN cheeses h ON u.uid = h.userUid",
         (
             # u1 has no color yet: no row for it
             ((("u1", {"uid": "u1", "accountId": "A"}), ("u2", {"uid": "u2", "accountId": "A"}),
               ("colors", "u2", {"userUid": "u2", "color": "red"})),
              (("u2", row(uid="u2", color="red", cheese="none")),)),
             # its color comes late: the row appears; the LEFT OUTER side fills in as it comes
             ((("colors", "u1", {"userUid": "u1", "color": "blue"}),), (("u1", row(uid="u1", color="blue", cheese="none")),)),
             ((("cheeses", "u1", {"userUid": "u1", "cheese": "brie"}),), (("u1", row(uid="u1", color="blue", cheese="brie")),)),
             # the color is deleted: retracted; a change meanwhile sends nothing
             ((("colors", "u1", None),), (("u1", ""),)),
             ((("cheeses", "u1", {"userUid": "u1", "cheese": "feta"}),), ()),
             # the color comes back: the row appears, with what changed meanwhile
             ((("colors", "u1", {"userUid": "u1", "color": "green"}),), (("u1", row(uid="u1", color="green", cheese="feta")),)),
             # the driving row goes: retracted; then its color goes, which sends nothing more
             ((("u2", None),), (("u2", ""),)),
             ((("colors", "u2", None),), ()),
             ((("u1", {"uid": "u1", "accountId": "B"}),), (("u1", row(uid="u1", color="green", cheese="feta")),)),
         ),
         joined=(("colors", "userUid STRING, color STRING", "userUid"), ("cheeses", "userUid STRING, cheese STRING", "userUid"))),
    Case("a_view_with_where_read_by_a_group_by",
         "uid STRING, accountId STRING, id INT",
         "accountId STRING, n BIGINT, top INT",
         "CREATE TEMPORARY VIEW adults AS SELECT uid, UPPER(accountId) AS acc, id FROM users WHERE id >= 18;\n"
         "INSERT INTO out SELECT acc, COUNT(*), MAX(id) FROM adults GROUP BY acc",
         (
             ((("u1", {"uid": "u1", "accountId": "a", "id": 20}), ("u2", {"uid": "u2", "accountId": "a", "id": 10}),
               ("u3", {"uid": "u3", "accountId": "b", "id": 30})),
              (("A", row(accountId="A", n=1, top=20)), ("B", row(accountId="B", n=1, top=30)))),
             # a row that starts matching the view's WHERE is counted; one that stops is taken out
             ((("u2", {"uid": "u2", "accountId": "a", "id": 18}),), (("A", row(accountId="A", n=2, top=20)),)),
             ((("u1", {"uid": "u1", "accountId": "a", "id": 5}),), (("A", row(accountId="A", n=1, top=18)),)),
             ((("u3", None),), (("B", ""),)),
         )),
    Case("group_by_over_a_left_join",
         "uid STRING, accountId STRING, id INT",
         "color STRING, n BIGINT, ids BIGINT",
         "INSERT INTO out SELECT COALESCE(c.color, 'none'), COUNT(*), SUM(u.id) FROM users u "
         "LEFT JOIN colors c ON u.uid = c.userUid GROUP BY COALESCE(c.color, 'none')",
         (
             ((("u1", {"uid": "u1", "accountId": "A", "id": 1}), ("u2", {"uid": "u2", "accountId": "A", "id": 2}),
               ("colors", "u1", {"userUid": "u1", "color": "red"})),
              (("none", row(color="none", n=1, ids=2)), ("red", row(color="red", n=1, ids=1)))),
             # a joined side's row moves its driving row from one group to another
             ((("colors", "u2", {"userUid": "u2", "color": "red"}),), (("none", ""), ("red", row(color="red", n=2, ids=3)))),
             ((("colors", "u1", {"userUid": "u1", "color": "blue"}),),
              (("blue", row(color="blue", n=1, ids=1)), ("red", row(color="red", n=1, ids=2)))),
             # the driving row is deleted: its group empties; an update of the driving row changes its sum
             ((("u2", None),), (("red", ""),)),
             ((("u1", {"uid": "u1", "accountId": "A", "id": 5}),), (("blue", row(color="blue", n=1, ids=5)),)),
             ((("colors", "u1", None),), (("blue", ""), ("none", row(color="none", n=1, ids=5)))),
         ),
         joined=(("colors", "userUid STRING, color STRING", "userUid"),)),
    Case("group_by_over_an_inner_join_with_where_on_the_joined_side",
         "uid STRING, accountId STRING",
         "accountId STRING, reds BIGINT",
         "INSERT INTO out SELECT u.accountId, COUNT(*) FROM users u JOIN colors c ON u.uid = c.userUid "
         "WHERE c.color = 'red' GROUP BY u.accountId",
         (
             ((("u1", {"uid": "u1", "accountId": "A"}), ("u2", {"uid": "u2", "accountId": "A"}),
               ("u3", {"uid": "u3", "accountId": "B"}), ("colors", "u1", {"userUid": "u1", "color": "red"}),
               ("colors", "u2", {"userUid": "u2", "color": "blue"})),
              (("A", row(accountId="A", reds=1)),)),
             ((("colors", "u3", {"userUid": "u3", "color": "red"}),), (("B", row(accountId="B", reds=1)),)),
             # a joined row that starts matching WHERE is counted; an inner side that goes takes it out
             ((("colors", "u2", {"userUid": "u2", "color": "red"}),), (("A", row(accountId="A", reds=2)),)),
             ((("colors", "u1", None),), (("A", row(accountId="A", reds=1)),)),
             ((("u2", {"uid": "u2", "accountId": "B"}),), (("A", ""), ("B", row(accountId="B", reds=2)))),
             ((("colors", "u3", {"userUid": "u3", "color": "green"}),), (("B", row(accountId="B", reds=1)),)),
         ),
         joined=(("colors", "userUid STRING, color STRING", "userUid"),)),
    Case("a_view_of_an_inner_join_grouped_with_having",
         "uid STRING, accountId STRING",
         "color STRING, n BIGINT",
         "CREATE VIEW colored AS SELECT u.uid, u.accountId AS acc, c.color FROM users u "
         "JOIN colors c ON u.uid = c.userUid WHERE c.color <> 'black';\n"
         "INSERT INTO out SELECT color, COUNT(*) FROM colored GROUP BY color HAVING COUNT(*) >= 2",
         (
             ((("u1", {"uid": "u1", "accountId": "A"}), ("u2", {"uid": "u2", "accountId": "A"}),
               ("u3", {"uid": "u3", "accountId": "B"}), ("colors", "u1", {"userUid": "u1", "color": "red"}),
               ("colors", "u2", {"userUid": "u2", "color": "red"}), ("colors", "u3", {"userUid": "u3", "color": "blue"})),
              (("red", row(color="red", n=2)),)),
             ((("colors", "u3", {"userUid": "u3", "color": "red"}),), (("red", row(color="red", n=3)),)),
             # a joined row that stops matching the view's WHERE leaves its group
             ((("colors", "u1", {"userUid": "u1", "color": "black"}),), (("red", row(color="red", n=2)),)),
             # an inner side that goes: the group falls below HAVING and is retracted once
             ((("colors", "u2", None),), (("red", ""),)),
             ((("colors", "u1", {"userUid": "u1", "color": "red"}),), (("red", row(color="red", n=2)),)),
         ),
         joined=(("colors", "userUid STRING, color STRING", "userUid"),)),
    Case("metadata_columns_in_a_projection",
         "uid STRING, name STRING, eventTime TIMESTAMP(3) METADATA, properties MAP<STRING, STRING> METADATA, "
         "topic STRING METADATA VIRTUAL, k STRING METADATA FROM 'key' VIRTUAL, sequenceId BIGINT METADATA VIRTUAL",
         "uid STRING, name STRING, at STRING, tier STRING, ours BOOLEAN, k STRING",
         "INSERT INTO out SELECT uid, name, CAST(eventTime AS STRING), COALESCE(properties['tier'], 'none'), "
         "topic LIKE 'persistent://public/default/users-%', k FROM users WHERE properties['skip'] IS NULL",
         (
             # a message without event time or properties reads NULL and an empty map
             ((with_metadata("u1", {"uid": "u1", "name": "al"}, {"tier": "gold"}, 1700000000123),
               ("u2", {"uid": "u2", "name": "bo"})),
              (("u1", row(uid="u1", name="al", at="2023-11-14 22:13:20.123", tier="gold", ours=True, k="u1")),
               ("u2", row(uid="u2", name="bo", at=None, tier="none", ours=True, k="u2")))),
             # WHERE on a property: a new version that stops matching is retracted, one that matches appears
             ((with_metadata("u1", {"uid": "u1", "name": "al"}, {"skip": "yes"}, 1700000000200),), (("u1", ""),)),
             ((with_metadata("u1", {"uid": "u1", "name": "al"}, None, 1700000000100),),
              (("u1", row(uid="u1", name="al", at="2023-11-14 22:13:20.100", tier="none", ours=True, k="u1")),)),
         )),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_changelog_of_each_statement(case, settings_factory, broker, spark):
    check_changelog(case, settings_factory, broker, spark)


# deletes, HAVING's retractions, DOUBLEs and BIGINTs, a join's NULLs: sent by the JVM's Pulsar client,
# the same changelog byte for byte (pipeline/sql/jvm_sender.py)
JVM_SENT = ("where_in_front_of_a_group_by_with_avg", "group_by_an_expression_and_a_column_with_having",
            "where_on_a_left_joins_driving_table")


@pytest.mark.parametrize("case", [c for c in CASES if c.name in JVM_SENT], ids=JVM_SENT)
def test_changelog_sent_by_the_jvm(case, settings_factory, broker, spark):
    check_changelog(case, settings_factory, broker, spark, sql__topic_sender="jvm")


def check_changelog(case: Case, settings_factory, broker, spark, **overrides) -> None:
    """Run the case's steps through its pipeline; assert each step's changelog and the current result."""
    settings = settings_factory(job__restart__delay="3s", **overrides)  # the delay rides out a loaded machine
    topics = fresh_topics("users", "out", *(name for name, _, _ in case.joined))
    url = broker.service_url

    def send(messages) -> None:
        for sent in messages:
            if len(sent) == 4:
                publish_with_metadata(url, topics[sent[0]], *sent[1:])
                continue
            table, key, record = sent if len(sent) == 3 else ("users", *sent)
            publish(url, topics[table], [message(key, record)])

    (first, first_changes), *later = case.steps
    send(first)  # before the start: one micro-batch
    expected: list[tuple[str, str]] = []
    cuts = [0]  # where each step's entries start: a step's messages on other keys may come in several
    # batches, so its entries are compared in any order, each step's after the steps before
    tail = TopicTail(url, topics["out"])
    with Running(settings, build_plan(case.sql(), topics), case.name, spark) as running:
        for step, (messages, changes) in enumerate([(None, first_changes), *later]):
            if messages is not None:
                send(messages)
            if not changes:
                continue  # nothing to wait for; the next step's changelog shows that nothing came
            expected += sorted(changes)
            cuts.append(len(expected))

            def arrived():
                running.check()
                on_topic = tail.read()
                return len(on_topic) >= len(expected) and on_topic

            on_topic = wait_for(arrived, 180 if step == 0 else 90, what=f"{case.name} step {step}")
            ends = cuts[1:-1] + [len(on_topic)]  # the last step's takes any entry after it too
            in_steps = [entry for start, end in zip(cuts, ends) for entry in sorted(on_topic[start:end])]
            assert in_steps == expected, f"step {step}"
        current = running.result(settings, case.name)
    table = latest_per_key(expected)
    key = case.target.split()[0]
    assert sorted(current, key=lambda r: r[key]) == [table[k] for k in sorted(table)]
