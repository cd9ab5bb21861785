"""SQL pipelines over changelog topics: Flink-style statements run as Spark streaming queries (DESIGN.md §11).

script.py (a script's statements → one plan per INSERT), tables.py (CREATE TABLE), views.py
(CREATE VIEW, merged into its readers), settings.py (SET), plan.py and select.py (one INSERT →
a plan, pure), expressions.py and sqltypes.py (Flink expressions → Spark SQL, and their types),
dialect.py (the seed's Flink SQL for sqlglot), envelope.py (messages → typed change rows or dead
letters), sink.py (the upsert topic and Parquet outputs), jvm_sender.py (the topic sent by the
JVM's Pulsar client), progress.py (metrics rows), runner.py (the query, its checkpoint and
restarts), source.py (the tables' topics), statement_set.py (several INSERTs as one query),
temporal.py and temporal_stream.py (FOR SYSTEM_TIME AS OF, planned and run), join_clock.py (its
tables' watermarks over their partitions, and idle tables).
The keyed state lives in Java operators, pipeline/jvm/statefulstreams/UpsertJoin.java and
GroupAggregate.java (and the job's VersionedLookup.java for a temporal join).
"""
