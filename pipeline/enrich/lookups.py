"""The lookups, each described once, and how the job applies one with the JVM operator.

A :class:`Lookup` says everything that differs between the user and the item lookup: the
changelog topic it holds, the id column orders carry, the state columns it attaches (and the
wire fields they come from), the column that records whether it was found, and the name it
gives a missing-state reason. Everything else (the envelope schema, the sinks' columns, the
model in rules.py, the operator's arguments, the topics and their settings, the wire format,
the console's selectors) is derived from :data:`LOOKUPS`, so a new changelog is one more entry
here, with its wire fields, plus its sample data (pipeline/feed/datagen.py).

:func:`apply_lookup` runs one lookup as the generic Java ``ChangelogLookup``
(pipeline/jvm/) through ``transformWithState``: called on the driver while the query
is built; the operator itself runs on the executors, keyed by the lookup's id column.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.fields import NONE, Field

JVM_CLASS = "statefulstreams.ChangelogLookup"
JAR_PATH = Path(__file__).resolve().parent.parent / "jvm" / "build" / "changelog-lookup.jar"
# Roles the operators understand (statefulstreams.LookupRole); any other role passes through.
SET, DELETE, LOOKUP, PASS = "set", "delete", "lookup", "pass"
# Spark reads a changelog's rows in this order; the operator applies one key's changes in it.
READ_ORDER = ("source_partition", "position")


@dataclass(frozen=True)
class Lookup:
    """One keyed lookup of orders against a changelog topic."""

    changelog: str  # the topic kind holding the records ("users")
    id_column: str  # the envelope column with the key, on orders and changelog rows ("user_id")
    order_field: str  # the order's wire field holding the key ("userId")
    fields: dict[str, tuple[str, str]]  # record wire field -> (state column, Spark type)
    reason: str  # its part of a missing-state reason ("user"), and its name in flags and the console
    wire_fields: tuple[Field, ...]  # the changelog record's wire fields (DESIGN.md §3), keyed by "id"

    @property
    def time_fields(self) -> frozenset[str]:
        """The record's wire fields that hold a time (epoch ms; the sinks keep them as timestamps)."""
        return frozenset(field.name for field in self.wire_fields if field.time)

    @property
    def state_columns(self) -> tuple[str, ...]:
        return tuple(column for column, _ in self.fields.values())

    @property
    def found_column(self) -> str:
        return f"{self.reason}_state"  # "found", "missing" (or "late" in event time), set by the operator

    @property
    def as_of_column(self) -> str:
        return f"{self.reason}_as_of"  # event time: the time of the version the order was enriched as of


USERS = Lookup("users", "user_id", "userId", {
    "firstName": ("user_first_name", "string"), "lastName": ("user_last_name", "string"),
    "emailAddress": ("user_email", "string"), "createdAt": ("user_created_at", "long")}, reason="user", wire_fields=(
    Field("id", int, True), Field("firstName", str, False), Field("lastName", str, False),
    Field("emailAddress", str, False), Field("createdAt", int, False, NONE, time=True),
    Field("deletedAt", int, False, NONE, time=True), Field("mergedAt", int, False, NONE, time=True),
    Field("parentUserId", int, False, NONE)))
ITEMS = Lookup("items", "item_id", "itemId", {
    "name": ("item_name", "string"), "category": ("item_category", "string"),
    "adjective": ("item_adjective", "string"), "modifier": ("item_modifier", "string"),
    "price": ("item_price", "double")}, reason="item", wire_fields=(
    Field("id", int, True), Field("createdAt", int, False, NONE, time=True), Field("adjective", str, False),
    Field("category", str, False), Field("modifier", str, False), Field("name", str, False),
    Field("price", float, True)))
# In the order they run: an order is looked up in each, left to right. Everything that names
# the lookups is derived from this tuple: the topics and their settings (topics.<changelog>),
# the wire format, the envelope and the sinks' columns, the missing-state reasons, the CLI's
# choices, the console's selectors and colours.
LOOKUPS = (USERS, ITEMS)
# Event time: the missing reasons of orders no lookup decided, their time being older than the
# watermark allows, or further ahead of the changelogs than enrichment.future_horizon.
LATE, FUTURE = "late", "future"
# Every missing-state reason: the lookups that did not find the order, joined in LOOKUPS order
# (rules.missing_reason: user, item, user_and_item), then LATE and FUTURE.
LOOKUP_REASONS = tuple("_and_".join(lookup.reason for lookup in chosen) for size in range(1, len(LOOKUPS) + 1)
                       for chosen in combinations(LOOKUPS, size))
MISSING_REASONS = (*LOOKUP_REASONS, LATE, FUTURE)
CHANGELOGS = tuple(lookup.changelog for lookup in LOOKUPS)  # the changelog topics' kinds: users, items


def lookups_missing(reason: str) -> tuple[Lookup, ...]:
    """The lookups that did not find an order missing for ``reason`` (``user_and_item`` -> USERS,
    ITEMS); none for ``late``, ``future`` or a reason no lookup gives."""
    if reason not in LOOKUP_REASONS:
        return ()
    parts = reason.split("_and_")
    return tuple(lookup for lookup in LOOKUPS if lookup.reason in parts)


def lookup_named(name: str) -> Lookup:
    """The lookup holding the changelog ``name`` (users, items)."""
    for lookup in LOOKUPS:
        if lookup.changelog == name:
            return lookup
    raise ConfigError(f"unknown lookup {name!r}; expected one of {[lookup.changelog for lookup in LOOKUPS]}")


def require_jar() -> Path:
    """The operator's jar, or one line saying how to build it."""
    if not JAR_PATH.is_file():
        raise ConfigError(f"the lookup operator's jar {str(JAR_PATH)!r} is missing; run `make setup` to build it")
    return JAR_PATH


def apply_lookup(frame, lookup: Lookup, max_wait_ms: int):
    """``frame`` (envelope rows) through one ChangelogLookup; the output has the same columns.

    # in:  {"kind": "orders", "op": "order", "user_id": 17, "user_first_name": None, …}
    # out: {… "user_first_name": "Ada", "user_state": "found", "first_seen_ms": 1795…, "waited_ms": 0}
    """
    from pyspark.sql import DataFrame

    spark = frame.sparkSession
    spec = build_lookup_spec(spark, lookup).maxWaitMs(int(max_wait_ms))
    return DataFrame(spark._jvm.statefulstreams.ChangelogLookup.apply(with_roles(frame, lookup)._jdf, spec), spark)


def with_roles(frame, lookup: Lookup):
    """``frame`` with the role of each row for ``lookup``'s operator (its changelog's upserts and
    tombstones, the orders, the rest passed on).

    # out: {… "lookup_role": "set" | "delete" | "lookup" | "pass"}
    """
    from pyspark.sql import functions as F

    op, kind = F.col("op"), F.col("kind")
    own_change = (kind == lookup.changelog) & op.isin("upsert", "delete")
    return frame.withColumn("lookup_role", F.when(own_change & (op == "upsert"), SET)
                            .when(own_change, DELETE).when(op == "order", LOOKUP).otherwise(PASS))


def build_lookup_spec(spark, lookup: Lookup):
    """The Java parameter object of ``lookup``'s operator (statefulstreams.LookupSpec): its
    columns by name; the caller adds the time bounds. Called on the driver."""
    return (spark._jvm.statefulstreams.LookupSpec().key(lookup.id_column).role("lookup_role")
            .state(list(lookup.state_columns)).found(lookup.found_column).firstSeen("first_seen_ms")
            .waited("waited_ms").readOrder(list(READ_ORDER)))


EVENT_JVM_CLASS = "statefulstreams.VersionedLookup"
NEWEST_OBSERVED = "event_time_newest"  # observed metric: newest time per changelog partition (clock name) and of orders
LATE_VERSIONS_PREFIX = "late_versions_"  # observed metric per changelog: late versions read in the batch
WATERMARK_COLUMN = "watermark_time"  # the timestamp Spark's watermark is taken from (event time only)


def topic_of_clock(name: str) -> str:
    """The topic kind of a partition's clock name (pipeline/source/clock.py ``partition_name``:
    ``users/0`` -> ``users``). Observed metrics, the clock file, the checkpoint's newest times and
    the ``watermarks`` rows all name partitions so."""
    return name.split("/", 1)[0]


def with_event_watermarks(frame, order_time: str, out_of_orderness_ms: int,
                          partitions: dict[str, list[int]] | None = None, on_every_row=None,
                          future_horizon_ms: int | None = None):
    """Envelope rows with their event time (``event_ms``) and Spark's event-time watermark: the
    least of the changelog partitions' newest event times, minus the out-of-orderness (called on
    the driver while the query is built).

    An order's time is its ``created_at`` (``order_time = created_at``) or its message event time;
    a version's time is its message event time, or its publish time when it has none. A dead
    letter's time counts for no watermark: its payload or its time could not be read, so its
    time is not trusted either (a message time the source could not hold makes one). Nor does a
    time more than ``future_horizon_ms`` past the message's own publish time (None: no such
    bound): one order of the year 9999 read while the changelogs are idle would carry the
    watermark there for good (Spark's watermark never goes back), making every later order late;
    a version dated ahead is still stored, it just does not say the changelog has got there.

    The source is read once, and there is one watermark node: each row's time counts up to its
    ``watermark_bound``, which the source gives it from the clock the driver keeps
    (pipeline/source/clock.py: a row of an active changelog partition counts up to the least
    newest time of the others, other rows not at all until every changelog partition is idle),
    and a batch whose clock moved carries one clock row at the clock's time. So no row moves the
    watermark past the least newest time of the active partitions, and where one partition moves
    alone in a batch, the watermark gets as far as one node per partition would have taken it.
    Each changelog partition's newest event time per batch is observed (``event_time_<clock
    name>``, ``partitions``: changelog -> partition numbers, -1 for a topic that is not
    partitioned, the default), and the orders' (``event_time_orders``): the driver's clock
    (event_clock.py) follows them. Partitions are listed when the query is built: rows of a
    partition added later hold no watermark back, and move none, until the job restarts.
    ``on_every_row`` (a function of a frame) is applied to the rows before the clock rows are
    dropped (the job counts the source's rows there).

    # out: {… "event_ms": 1700000000123} (and Spark's watermark)
    """
    from pyspark.sql import functions as F

    from pipeline.source.clock import partition_name
    from pipeline.source.rows import CLOCK_KIND
    from pipeline.wire import MAX_TIME_MS, MIN_TIME_MS

    message_time = F.coalesce(F.col("event_time"), F.col("published_at"))
    own_time = F.coalesce(F.col("created_at"), message_time) if order_time == "created_at" else message_time
    timed = frame.withColumn("event_ms", F.when(F.col("op") == "dead", F.lit(None).cast("long"))
                             .when(F.col("kind") == "orders", own_time).otherwise(message_time))
    # Every time is within years 1 to 9999 here (the wire's checks, the source's), which Spark's
    # timestamps hold; a time beyond would fail the batch in timestamp_millis (ANSI mode), so
    # anything else counts for no watermark rather than stop the job.
    held = F.col("event_ms").between(MIN_TIME_MS, MAX_TIME_MS)
    if future_horizon_ms is not None:
        ahead = F.col("event_ms") - F.col("published_at")
        held = held & F.coalesce(ahead <= F.lit(int(future_horizon_ms)), F.lit(True))
    kind = F.col("kind")
    stamped = timed.withColumn(WATERMARK_COLUMN, F.when(
        held & F.col("watermark_bound").isNotNull(),
        F.timestamp_millis(F.least(F.col("event_ms"), F.col("watermark_bound")))))
    observed = [F.max(F.when((kind == "orders") & held, F.col("event_ms"))).alias(partition_name("orders", -1))]
    for lookup in LOOKUPS:
        for p in sorted((partitions or {}).get(lookup.changelog) or [-1]):
            own = (kind == lookup.changelog) & (F.coalesce(F.col("source_partition"), F.lit(-1)) == int(p))
            observed.append(F.max(F.when(own & held, F.col("event_ms"))).alias(partition_name(lookup.changelog, p)))
    stamped = stamped.observe(NEWEST_OBSERVED, *observed)
    if on_every_row is not None:
        stamped = on_every_row(stamped)
    # The clock rows have moved the watermark: they go. The cut must stay above the watermark:
    # Spark pushes a filter below a watermark unless it reads the watermark column.
    stamp = F.col(WATERMARK_COLUMN)
    cut = F.when(kind != CLOCK_KIND, stamp.isNull() | stamp.isNotNull()).otherwise(F.lit(False))
    # Spark's stateful operators drop input rows whose event-time column is below the watermark;
    # without the column the lookups see every row (late orders are decided, never dropped) and
    # still get the watermark, which the plan's watermark node keeps.
    return (stamped.withWatermark(WATERMARK_COLUMN, f"{int(out_of_orderness_ms)} milliseconds")
            .filter(cut).drop(WATERMARK_COLUMN))


def apply_event_lookup(frame, lookup: Lookup, max_wait_ms: int, allowed_lateness_ms: int, future_after_ms: int):
    """``frame`` (envelope rows with event times and a watermark, see :func:`with_event_watermarks`)
    through one VersionedLookup; the output has the same columns.

    An order more than ``future_after_ms`` (``event_rules.future_after``: the out-of-orderness +
    ``enrichment.future_horizon``) past the watermark is decided ``future`` (event_rules.is_future).

    Its late versions are counted (observed metric ``late_versions_<changelog>``) and left out.

    # in:  {"kind": "orders", "op": "order", "user_id": 17, "event_ms": 1700000000123, "late": None, …}
    # out: {… "user_first_name": "Ada", "user_state": "found", "user_as_of": 1700000000001, "late": 0}
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    spark = frame.sparkSession
    spec = (build_lookup_spec(spark, lookup).maxWaitMs(int(max_wait_ms)).eventMs("event_ms").late("late")
            .asOf(lookup.as_of_column).allowedLatenessMs(int(allowed_lateness_ms))
            .futureAfterMs(int(future_after_ms)))
    joined = spark._jvm.statefulstreams.VersionedLookup.apply(with_roles(frame, lookup)._jdf, spec)
    # The operator emits each late version once (older than watermark - allowed lateness; it is
    # still stored): counted per batch here (event_clock.py records the count), then dropped.
    late_version = (F.col("kind") == lookup.changelog) & F.col("op").isin("upsert", "delete")
    return (DataFrame(joined, spark)
            .observe(f"{LATE_VERSIONS_PREFIX}{lookup.changelog}", F.count(F.when(late_version, 1)).alias("count"))
            .filter(~late_version))
