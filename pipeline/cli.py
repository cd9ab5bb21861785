"""The command line: ``python -m pipeline <command>``; the same control functions as the console.

Every command loads the settings once (defaults < TOML < env < flags) and hands them down.
Any StatefulStreamsError is printed as one line ``error: …`` with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Callable

from pipeline.config import KEYS, SECRET_KEYS, Settings, load_settings, parse_set_flags
from pipeline.enrich.lookups import CHANGELOGS, LOOKUPS, MISSING_REASONS
from pipeline.errors import ConfigError, StatefulStreamsError


def _settings(args: argparse.Namespace) -> Settings:
    cli = parse_set_flags(args.set)
    for key in sorted(cli.keys() & set(SECRET_KEYS)):
        # any local user reads a process's command line (ps, /proc/<pid>/cmdline)
        env = next(k.env for k in KEYS if k.name == key)
        raise ConfigError(f"--set {key}=… would put a secret on the command line, where any local user "
                          f"reads it; export {env} instead")
    if args.data_dir:
        cli["paths.data_dir"] = args.data_dir
    if args.service_url:
        cli["pulsar.service_url"] = args.service_url
    for flag, key in (("exporter_address", "exporter.address"), ("exporter_port", "exporter.port")):
        if getattr(args, flag, None) is not None:
            cli[key] = getattr(args, flag)
    return load_settings(args.config, cli=cli)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one ``error: …`` line (exit 2), as every other error."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}; see --help\n")


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {minimum}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {minimum}")
        return value

    parse.__name__ = "whole number"
    return parse


def finite_rate(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return value


def cmd_broker(args, settings):
    from pipeline.store import ensure_data_dir

    ensure_data_dir(settings.data_dir)
    if args.apache:
        from pipeline.feed.apache_broker import serve_forever as serve_apache

        serve_apache(settings)
        return
    from pipeline.feed.broker import serve_forever

    serve_forever(settings)


def cmd_topics(args, settings):
    from pipeline.feed.broker import resolve_service_url
    from pipeline.feed.topics import ensure_topics

    ensure_topics(settings, resolve_service_url(settings), partitions=args.partitions)
    print("topics ready: " + ", ".join(settings.topics.values()))


def cmd_datagen(args, settings):
    from pipeline.feed.datagen import main as datagen_main

    datagen_main(args, settings)


def cmd_produce(args, settings):
    from pipeline.feed.producers import main as produce_main

    produce_main(args, settings)


def cmd_run(args, settings):
    from pipeline.job import run_forever

    try:
        run_forever(settings, max_batches=args.max_batches)
    finally:
        # Stop Spark while Python still answers its callbacks: a JVM left to die with the
        # process posts listener events to a closed gateway and prints py4j traces.
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()


def cmd_sql(args, settings):
    from pipeline.sql.launch import launch

    return launch(settings, args.files, args.statement, args.name, args.topic, args.check, args.samples, args.max_batches)


def cmd_savepoint(args, settings):
    from pipeline import control

    if args.action == "take":
        info = control.take_savepoint(settings, args.name)
        print(f"savepoint {info.name!r} taken at batch {info.batch_id} ({info.size_bytes} bytes)")
    elif args.action == "list":
        for info in control.list_savepoints(settings):
            print(f"{info.name}\tbatch {info.batch_id}\t{info.taken_at}\t{info.size_bytes} bytes")
    else:
        if not args.name:
            raise StatefulStreamsError("savepoint restore needs a NAME; see 'python -m pipeline savepoint list'")
        info = control.restore_savepoint(settings, args.name)
        for warning in info.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"restored savepoint {info.name!r} (batch {info.batch_id}); start the job with 'python -m pipeline run'")


def cmd_replay(args, settings):
    from pipeline import control

    request = control.request_replay(settings, args.topic, from_time=args.from_time, requested_by="cli")
    print(f"replay #{request['seq']} of {args.topic} requested from {request['from']}")


def cmd_redrive(args, settings):
    from pipeline import control

    plan = control.redrive(settings, invoice_ids=args.invoice, reason=args.reason, requested_by="cli",
                           **{lookup.id_column: getattr(args, lookup.id_column) for lookup in LOOKUPS})
    skipped = sum(plan.skipped.values())
    print(f"re-drove {plan.count} missing-state order line(s) to {settings.topics['orders']}"
          + (f"; skipped {skipped}: " + ", ".join(f"{n} {why}" for why, n in plan.skipped.items()) if skipped else ""))


def cmd_state(args, settings):
    from pipeline import store
    from pipeline.enrich.lookups import lookup_named
    from pipeline.runtime.spark import build_spark
    from pipeline.control.state import inspect_key

    if args.serve:
        return _serve_state(settings)
    if not args.targets or len(args.targets) % 2:
        raise StatefulStreamsError(f"state takes LOOKUP KEY pairs, e.g. 'users 42 items 7'; got {' '.join(args.targets)!r}")
    targets = []
    for name, key in zip(args.targets[::2], args.targets[1::2]):
        if not key.lstrip("-").isdigit():
            raise StatefulStreamsError(f"key {key!r} of {name} is not a whole number; give the numeric id")
        targets.append((lookup_named(name), int(key)))
    checkpoint = store.checkpoint_dir(settings.data_dir)
    # A small session of its own on this machine: it only reads the checkpoint the job writes.
    spark = build_spark(settings.with_overrides(spark__master="local[1]", spark__shuffle_partitions=1),
                        app_name="stateful-streams-state")
    try:
        found = [inspect_key(spark, checkpoint, lookup, key) for lookup, key in targets]
    finally:
        spark.stop()
    print("\n".join(state.to_json() if args.json else state.describe() for state in found))


def _serve_state(settings) -> None:
    """The console's look-up worker: requests on stdin, answers on stdout, one Spark session."""
    from pipeline import store
    from pipeline.runtime.spark import build_spark
    from pipeline.control.state import serve_lookups

    spark = build_spark(settings.with_overrides(spark__master="local[1]", spark__shuffle_partitions=1),
                        app_name="stateful-streams-state")
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not mix with the answers
    try:
        serve_lookups(spark, store.checkpoint_dir(settings.data_dir), sys.stdin, lambda text: (out.write(text), out.flush()))
    finally:
        spark.stop()


def cmd_app(args, settings):
    from pipeline.console import serve_console

    return serve_console(settings)


def cmd_demo(args, settings):
    from pipeline.demo import run_demo

    run_demo(settings)


def cmd_exporter(args, settings):
    # The exporter reads through app/ (the reading side); pipeline/ never imports app/, so it
    # runs as its own process, `python -m app.exporter`, with these settings as SS_* variables.
    import os
    import subprocess

    from pipeline.feed.broker import die_with_parent
    from pipeline.console import PROJECT_ROOT, settings_environment

    env = {name: value for name, value in os.environ.items() if not name.startswith("SS_")}
    env.update(settings_environment(settings))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    code = subprocess.call([sys.executable, "-m", "app.exporter"], env=env, cwd=PROJECT_ROOT, preexec_fn=die_with_parent)
    if code:
        raise SystemExit(code)  # the exporter has printed its one-line error


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m pipeline",
        description="Stateful Streams: enrich Pulsar orders with the latest user and item in Spark.",
    )
    parser.add_argument("--config", help="TOML settings file (or set SS_CONFIG)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting, e.g. --set enrichment.max_wait=5s")
    parser.add_argument("--data-dir", help="shortcut for --set paths.data_dir=…")
    parser.add_argument("--service-url", help="shortcut for --set pulsar.service_url=…")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable, help: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help, description=help)
        command.set_defaults(func=func)
        return command

    broker = add("broker", cmd_broker, "run the embedded pulsar-lite broker in the foreground and print its URL")
    broker.add_argument("--apache", action="store_true",
                        help="run Apache Pulsar standalone instead (fetched from Maven Central once, about 200 MB; "
                             "starts in about 15-30 s) and print its service and admin URLs")
    topics = add("topics", cmd_topics, "create the three topics (partitions and retention where an admin API exists)")
    topics.add_argument("--partitions", type=whole_number(1), default=1, help="partitions per topic (admin API only)")

    datagen = add("datagen", cmd_datagen, "generate deterministic users, items and orders CSVs")
    datagen.add_argument("--out", default="data", help="output folder (default: data)")
    datagen.add_argument("--users", type=int, default=2000)
    datagen.add_argument("--items", type=int, default=300)
    datagen.add_argument("--orders", type=int, default=20000)
    datagen.add_argument("--seed", type=int, default=42)

    produce = add("produce", cmd_produce, "publish a CSV of users, items or orders as keyed JSON")
    produce.add_argument("topic", choices=[*CHANGELOGS, "orders"])
    produce.add_argument("--file", help="CSV to read (default: data/<topic>.csv)")
    produce.add_argument("--rate", type=finite_rate, default=0.0, help="messages per second (0 = as fast as possible)")
    produce.add_argument("--limit", type=whole_number(0), default=0, help="stop after this many messages (0 = all)")
    produce.add_argument("--loop", action="store_true", help="start over at the end (orders only, for demos)")
    produce.add_argument("--quiet", action="store_true", help="no progress bar")

    run = add("run", cmd_run, "run the enrichment job in the foreground")
    run.add_argument("--max-batches", type=whole_number(0), default=0, help="stop after this many micro-batches (0 = never)")

    sql = add("sql", cmd_sql, "run SQL statements (CREATE TABLE … upsert-pulsar, INSERT INTO … SELECT) as a streaming pipeline")
    sql.add_argument("files", nargs="*", metavar="FILE", help="a .sql file of statements separated by ';' (see data/sql/); "
                     "several run side by side on one Spark session, each named by its file")
    sql.add_argument("--statement", action="append", help="one statement (repeatable, instead of a file)")
    sql.add_argument("--name", help="the pipeline's name: its folder under <data_dir>/sql/ (default: the file's stem)")
    sql.add_argument("--topic", action="append", metavar="TABLE=TOPIC", help="read or write this table on another topic")
    sql.add_argument("--check", action="store_true", help="check the statements, print the plan and exit")
    sql.add_argument("--samples", action="store_true", help="first publish each file's sample messages (NAME.messages.jsonl beside it)")
    sql.add_argument("--max-batches", type=whole_number(0), default=0, help="stop after this many micro-batches (0 = never)")

    savepoint = add("savepoint", cmd_savepoint, "take, list or restore savepoints")
    savepoint.add_argument("action", choices=["take", "list", "restore"])
    savepoint.add_argument("name", nargs="?", help="savepoint name (take: default is a timestamp)")

    replay = add("replay", cmd_replay, "replay a changelog topic into the running job")
    replay.add_argument("topic", choices=CHANGELOGS)
    replay.add_argument("--from-time", help="ISO time to start from (default: the earliest message)")

    redrive = add("redrive", cmd_redrive, "republish missing-state orders so they are enriched against today's state")
    redrive.add_argument("--invoice", type=int, action="append", help="invoice id (repeatable)")
    for lookup in LOOKUPS:  # --user, --item
        redrive.add_argument(f"--{lookup.reason}", type=int, dest=lookup.id_column,
                             help=f"every missing order of this {lookup.reason} id")
    redrive.add_argument("--reason", choices=MISSING_REASONS, help="every missing order with this reason")

    state = add("state", cmd_state, "print what the job holds for a key: its latest version and the orders waiting")
    state.add_argument("targets", nargs="*", metavar="LOOKUP KEY", help=f"{' or '.join(CHANGELOGS)}, then the id; pairs may repeat")
    state.add_argument("--json", action="store_true", help="one JSON object per key")
    state.add_argument("--serve", action="store_true", help="answer JSON look-up requests on stdin on one Spark "
                       "session (the console's worker; see pipeline/control/state_service.py)")

    add("app", cmd_app, "run the Streamlit console on app.address:app.port")
    add("demo", cmd_demo, "run broker, producers, job and console together (what 'make demo' runs)")
    exporter = add("exporter", cmd_exporter, "serve the job's metrics to Prometheus (runs python -m app.exporter)")
    exporter.add_argument("--address", dest="exporter_address", help="shortcut for --set exporter.address=…")
    exporter.add_argument("--port", dest="exporter_port", help="shortcut for --set exporter.port=…")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = _settings(args)
        code = args.func(args, settings)
    except StatefulStreamsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file system problem no command foresaw: still one line, naming the path
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else 0
