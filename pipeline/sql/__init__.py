"""SQL pipelines over changelog topics: Flink-style statements run as Spark streaming queries (DESIGN.md §11).

plan.py (statements → plan, pure), dialect.py (the seed's Flink SQL for sqlglot), envelope.py
(messages → typed change rows or dead letters), sink.py (the upsert topic and Parquet outputs),
progress.py (metrics rows), runner.py (the query, its checkpoint and restarts). The keyed state
lives in two Java operators, pipeline/jvm/statefulstreams/UpsertJoin.java and GroupAggregate.java.
"""
