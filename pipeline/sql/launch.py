"""``python -m pipeline sql``: statements from files or flags → named plans → pipelines running side by side.

Called on the driver, once per process. Every plan is built (and so every statement checked)
before anything starts, so a statement outside the subset fails at once with its one line. The
pipelines share one SparkSession, each its own streaming query, checkpoint and folder, each in a
thread; Ctrl-C or SIGTERM stops them all cleanly, and the first to fail for good stops the rest.
"""

from __future__ import annotations

import threading
from pathlib import Path

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.sql.plan import Plan
from pipeline.sql.script import build_pipeline
from pipeline.sql.runner import name_from_path, run_sql_pipeline


def parse_topic_flags(pairs: list[str] | None) -> dict[str, str]:
    """``TABLE=persistent://…`` flags -> {table: topic}."""
    topics = {}
    for pair in pairs or []:
        table, sep, topic = pair.partition("=")
        if not sep or not table or "://" not in topic:
            raise ConfigError(f"--topic {pair!r} is not TABLE=persistent://tenant/ns/topic")
        topics[table] = topic
    return topics


def load_plans(files: list[str], statements: list[str] | None, name: str | None,
               topics: dict[str, str]) -> list[tuple[str, tuple[Plan, ...], Path | None]]:
    """(name, its plans: one per INSERT, file) per pipeline; one line naming the problem otherwise."""
    if bool(files) == bool(statements):
        raise ConfigError("give .sql files or --statement (repeatable), not both and not neither")
    if name and len(files) > 1:
        raise ConfigError("--name names one pipeline; with several files each is named by its file")
    if statements:
        return [(name or "sql", build_pipeline(";\n".join(statements), topics), None)]
    plans = []
    for file in files:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read SQL file {file!r}: {exc.strerror or exc}") from exc
        plans.append((name or name_from_path(file), build_pipeline(text, topics), Path(file)))
    names = [n for n, _, _ in plans]
    if len(set(names)) != len(names):
        raise ConfigError(f"two pipelines would share a name in {names}; give the files different names")
    return plans


def publish_file_samples(settings: Settings, service_url: str, plans) -> None:
    from pipeline.sql.samples import load_samples, publish_samples
    from pipeline.feed.topics import make_client

    client = make_client(service_url, token=settings["pulsar.auth_token"])
    try:
        for name, plan, file in plans:
            path = file.with_name(file.stem + ".messages.jsonl") if file else None
            if path is None or not path.is_file():
                raise ConfigError(f"--samples: pipeline {name!r} has no sample file {str(path)!r}")
            sent = publish_samples(client, load_samples(path, plan))
            print(f"{name}: published {sent} sample messages from {path}")
    finally:
        client.close()


def describe_spark_sql(plan) -> list[str]:
    """What Spark evaluates for a plan, one line each (``--check`` prints them): WHERE, the derived
    columns, HAVING and each computed target column, as the Spark SQL they were translated to."""
    lines = []
    if plan.where:
        lines.append(f"WHERE, before the operators: {plan.where}")
    if plan.where_joined:
        inner = "".join(f" (`present{side}`: {plan.sides[side].name} has the key's row, an inner join)"
                        for side in plan.inner)
        lines.append(f"WHERE, on the joined rows: {plan.where_joined}{inner}")
    lines += [f"{d.name} = {d.sql}" for d in plan.derived]
    lines += [f"{a.name} = {a.function}({a.input or '*'})" for a in plan.aggregates
              if plan.kind == "aggregate"]
    if plan.having:
        lines.append(f"HAVING: {plan.having}")
    lines += [f"{o.name} = {o.expression}" for o in plan.outputs if o.expression]
    return lines


def describe_joins(plan) -> list[str]:
    """How a plan joins, one line each (``--check`` prints them): a temporal join's columns and
    time (pipeline/sql/temporal.py) or a foreign-key join's columns and operator
    (pipeline/sql/foreign_key.py); a join on the primary keys is UpsertJoin's, said by the plan's kind."""
    if plan.temporal:
        driving, time = plan.sides[0], plan.temporal.left_time
        every = "both tables'" if len(plan.sides) == 2 else f"all {len(plan.sides)} tables'"
        return [f"temporal join ({'INNER' if join.inner else 'LEFT'}): {driving.name}.{join.join_column} = "
                f"{versioned.name}.{versioned.primary_key} AS OF {driving.name}.{time} (VersionedLookup, event "
                f"time): each {driving.name} row gets the {versioned.name} version current at its {time}, sent once "
                f"{every} watermarks have passed it" for join in plan.temporal.joins
                for versioned in [plan.sides[join.side]]]
    lines = []
    for side, of_side, column in plan.foreign_keys:  # one ForeignKeyJoin each, in the order written
        driving, referenced = plan.sides[of_side], plan.sides[side]
        kind = "INNER" if side in plan.inner else "LEFT"
        columns = f"{driving.name}.{column} = {referenced.name}.{referenced.primary_key}"
        lines.append(f"foreign-key join ({kind}): {columns}, keyed by the foreign key value (ForeignKeyJoin): "
                     f"a changed {referenced.name} row updates the {driving.name} rows referencing it")
    return lines


def launch(settings: Settings, files: list[str], statements: list[str] | None, name: str | None,
           topic_flags: list[str] | None, check: bool, samples: bool, max_batches: int) -> int:
    plans = load_plans(files, statements, name, parse_topic_flags(topic_flags))
    if check:
        for pipeline, inserts, _ in plans:
            if len(inserts) > 1:
                print(f"{pipeline}: a statement set of {len(inserts)} INSERTs, one query reading each message once")
            for plan in inserts:
                sources = ", ".join(f"{t.name} <- {t.topic}" for t in plan.sides)
                print(f"{pipeline}: {plan.kind} of {sources} into {plan.target.name} -> {plan.target.topic}")
                for line in describe_joins(plan) + describe_spark_sql(plan):
                    print(f"  {line}")
        return 0
    from pipeline.job import connect_broker
    from pipeline.runtime.supervisor import stop_on_signals
    from pipeline.runtime.spark import build_spark

    stop = threading.Event()
    stop_on_signals(stop)
    service_url, own_broker = connect_broker(settings)
    try:
        if samples:
            publish_file_samples(settings, service_url, plans)
        spark = build_spark(settings, app_name="sql-pipelines")
        stop_on_signals(stop)
        errors: list[BaseException] = []

        def run(pipeline: str, plan: tuple[Plan, ...]) -> None:
            try:
                run_sql_pipeline(settings, plan, pipeline, max_batches=max_batches, stop=stop, spark=spark)
            except BaseException as exc:  # re-raised on the main thread
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=run, args=(n, p), name=f"sql-{n}") for n, p, _ in plans]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
        if errors:
            raise errors[0]
        return 0
    finally:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()
        if own_broker is not None:
            own_broker.stop()
