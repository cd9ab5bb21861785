package statefulstreams;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.ListState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

import statefulstreams.Rows.Field;

/**
 * The event-time twin of {@link ChangelogLookup}: keeps the versions of each key with their event
 * times and attaches to an order the version that was current at the order's event time, as
 * Flink SQL's event-time temporal join does. Input rows have the same roles (set, delete, lookup,
 * pass) and the same columns, plus the row's event time ({@code eventMs}: an order's time, a
 * version's time), the order's lateness flag and the as-of column that receives the version time.
 *
 * <p>Time is Spark's event-time watermark ({@link TimeMode#EventTime()}): the input has one
 * watermark per changelog topic and Spark keeps the least of them, so the watermark passes a
 * time only when both changelogs have been read past it (minus their out-of-orderness).
 *
 * <p>State per key, in the RocksDB state store: {@code versions} (ListState: time, read order,
 * tombstone flag and the state columns of each version) and {@code waiting} (ListState, whole
 * order rows), plus event-time timers.
 *
 * <p>Call order and guarantees (Spark calls {@code handleInputRows} once per key with input in a
 * batch, then {@code handleExpiredTimer} once per due timer; the watermark is the one of the
 * batch, set from the batches before):
 * <ol>
 *   <li>A batch's versions for a key are added to its history before its orders are looked at.
 *       A version the history already holds (same time, same record or tombstone: a replay
 *       re-reading it) is not added again. A version older than watermark - allowedLateness is
 *       late: it is still added (it is current for orders still to come) and is also emitted
 *       once, with the late column 1, so the caller can count it and drop it.</li>
 *   <li>An order seen for the first time (late column null) is late when its time is below
 *       watermark - allowedLateness: it is emitted at once with found = {@code late} and no
 *       state, and a later lookup passes it on as late. Late orders are never dropped.</li>
 *   <li>An order is from the future when the watermark is above 0 (every changelog partition
 *       has a time) and its time is more than futureAfter (the out-of-orderness + the future
 *       horizon) past the watermark: it is emitted at once with found = {@code future} and no
 *       state (late column 2), and a later lookup passes it on as future. Otherwise an order
 *       could wait forever (a createdAt in the year 9999). One seen at watermark 0 waits, with
 *       a timer at 1, and is judged again at the first watermark above 0; once judged not
 *       future it never becomes so (the watermark only grows).</li>
 *   <li>Otherwise it is decided once the watermark is past its time and, when no record is
 *       current at its time, past its time + maxWait: with the record current at its time, or
 *       the first record within maxWait after it (waited = that version's time - its time), or
 *       missing (waited = maxWait). Until then it waits, with a timer; the orders waiting on a
 *       key are looked at again whenever the key has input.</li>
 *   <li>Versions older than watermark - allowedLateness - maxWait are dropped, except the newest
 *       of them (still current there).</li>
 * </ol>
 * The decisions are {@code event_rules.VersionedLookupModel} in {@code pipeline/enrich/event_rules.py}.
 */
public final class VersionedLookup extends StatefulProcessor<Long, Row, Row> {
  private static final long serialVersionUID = 1L;
  // The late column of an order: how its time stood when first judged.
  static final long ON_TIME_FLAG = 0L, LATE_FLAG = 1L, FUTURE_FLAG = 2L;

  private final LookupColumns columns;
  private final Field eventMs, late, asOf;
  private final long maxWaitMs, allowedLatenessMs, futureAfterMs;
  // A version row: version_ms, the read order columns (read_0, ...), tombstone, the state columns.
  private final StructType versionSchema;
  private final Field versionMs, tombstone;
  private final Field[] versionOrder;  // version_ms, then the read order columns
  private final Field[] versionState;
  private final Field[] versionIdentity;  // tombstone and state: what makes two versions of one time the same
  private transient ListState<Row> versions;
  private transient ListState<Row> waiting;

  VersionedLookup(LookupColumns columns, LookupSpec spec) {
    this.columns = columns;
    this.eventMs = new Field(columns.schema, spec.eventMs);
    this.late = new Field(columns.schema, spec.late);
    this.asOf = new Field(columns.schema, spec.asOf);
    this.maxWaitMs = spec.maxWaitMs;
    this.allowedLatenessMs = spec.allowedLatenessMs;
    this.futureAfterMs = spec.futureAfterMs;
    List<StructField> fields = new ArrayList<>();
    List<String> order = new ArrayList<>();
    fields.add(DataTypes.createStructField("version_ms", DataTypes.LongType, false));
    order.add("version_ms");
    for (int i = 0; i < columns.order.length; i++) {
      fields.add(DataTypes.createStructField("read_" + i, DataTypes.LongType, true));
      order.add("read_" + i);
    }
    fields.add(DataTypes.createStructField("tombstone", DataTypes.BooleanType, false));
    fields.addAll(List.of(columns.stateSchema.fields()));
    this.versionSchema = DataTypes.createStructType(fields);
    this.versionMs = new Field(versionSchema, "version_ms");
    this.tombstone = new Field(versionSchema, "tombstone");
    this.versionOrder = Field.all(versionSchema, order);
    this.versionState = Field.all(versionSchema, List.of(columns.stateSchema.fieldNames()));
    List<String> identity = new ArrayList<>(List.of("tombstone"));
    identity.addAll(List.of(columns.stateSchema.fieldNames()));
    this.versionIdentity = Field.all(versionSchema, identity);
  }

  /**
   * The lookup as a streaming Dataset: {@code input} (which must carry an event-time watermark)
   * grouped by the key column and run through {@code transformWithState} in event time, append
   * mode. The output has the input's schema. Called on the driver, from Python through py4j.
   */
  public static Dataset<Row> apply(Dataset<Row> input, LookupSpec spec) {
    StructType schema = input.schema();
    LookupColumns columns = new LookupColumns(schema, spec);
    return KeyedByColumn.group(input, spec.key, Encoders.LONG(), 0L)
        .transformWithState(new VersionedLookup(columns, spec), TimeMode.EventTime(), OutputMode.Append(),
            Encoders.row(schema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    versions = getHandle().getListState("versions", Encoders.row(versionSchema), TTLConfig.NONE());
    waiting = getHandle().getListState("waiting", Encoders.row(columns.schema), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(Long key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    long watermark = Math.max(0L, timerValues.getCurrentWatermarkInMs());
    List<Row> history = Rows.load(versions);
    int before = history.size();
    Rows.Split split = Rows.split(rows, row -> columns.roleOf(row).part);
    List<Row> out = split.passed;
    split.changes.sort(Rows.readOrder(columns.order));  // of one time and one record, the first read is the one kept
    for (Row row : split.changes) {
      Row version = version(row, columns.roleOf(row) == LookupRole.DELETE);
      if (holds(history, version)) {
        continue;  // a replay re-reads versions already held: one copy each
      }
      history.add(version);
      if (versionMs.getLong(version) < watermark - allowedLatenessMs) {
        out.add(Rows.with(row, late, 1L, columns.schema));  // a late version: stored, and emitted once to be counted
      }
    }
    history.sort(Rows.readOrder(versionOrder));
    List<Row> waits = new ArrayList<>();
    for (Row row : split.lookups) {
      long time = eventMs.getLong(row);
      long flag = late.isNull(row) ? flag(time, watermark) : late.getLong(row);
      Row judged = Rows.with(row, late, flag, columns.schema);
      if (flag == LATE_FLAG) {
        out.add(decide(judged, null, LookupOutcome.LATE));
      } else if (flag == FUTURE_FLAG) {
        out.add(decide(judged, null, LookupOutcome.FUTURE));
      } else if (!decideIfDue(judged, history, watermark, out)) {
        waits.add(judged);
      }
    }
    registerTimers(waits, history, watermark);
    if (waiting.exists()) {
      // Orders already waiting may be due now that the key has new versions, and must be decided
      // before the history is pruned below (the model decides them in the same batch).
      List<Row> kept = decideWaiting(history, watermark, out);
      kept.addAll(waits);
      Rows.replace(waiting, kept);
    } else {
      for (Row row : waits) {
        waiting.appendValue(row);
      }
    }
    finish(history, before != history.size(), watermark);
    return CollectionConverters.asScala(out.iterator());
  }

  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(Long key, TimerValues timerValues,
                                                           ExpiredTimerInfo expiredTimerInfo) {
    long watermark = Math.max(0L, timerValues.getCurrentWatermarkInMs());
    List<Row> out = new ArrayList<>();
    List<Row> history = Rows.load(versions);
    history.sort(Rows.readOrder(versionOrder));
    if (waiting.exists()) {
      List<Row> kept = decideWaiting(history, watermark, out);
      Rows.replace(waiting, kept);
      registerTimers(kept, history, watermark);
    }
    finish(history, false, watermark);
    return CollectionConverters.asScala(out.iterator());
  }

  /** Decide the waiting orders that are due (adding them to {@code out}); the ones still waiting. */
  private List<Row> decideWaiting(List<Row> history, long watermark, List<Row> out) {
    List<Row> kept = new ArrayList<>();
    for (Row row : Rows.load(waiting)) {
      if (!decideIfDue(row, history, watermark, out)) {
        kept.add(row);
      }
    }
    return kept;
  }

  /** How an order's time stands at {@code watermark}: late, from the future, or neither. */
  private long flag(long time, long watermark) {
    if (time < watermark - allowedLatenessMs) {
      return LATE_FLAG;
    }
    return isFuture(time, watermark) ? FUTURE_FLAG : ON_TIME_FLAG;
  }

  /** Whether an order's time is more than futureAfter past the watermark (judged above 0 only). */
  private boolean isFuture(long time, long watermark) {
    return watermark > 0 && time - watermark > futureAfterMs;  // both times are bounded: no overflow
  }

  /**
   * Decide an order if the watermark allows (adding it to {@code out}): from the future (only an
   * order first judged at watermark 0 can turn out so here), or due; false if it must wait.
   */
  private boolean decideIfDue(Row row, List<Row> history, long watermark, List<Row> out) {
    long time = eventMs.getLong(row);
    if (isFuture(time, watermark)) {
      out.add(decide(Rows.with(row, late, FUTURE_FLAG, columns.schema), null, LookupOutcome.FUTURE));
      return true;
    }
    if (watermark <= time) {
      return false;
    }
    Row current = currentAt(history, time);
    if (current != null) {
      out.add(decide(row, current, null));
      return true;
    }
    if (maxWaitMs > 0 && watermark <= time + maxWaitMs) {
      return false;
    }
    for (Row v : history) {
      long at = versionMs.getLong(v);
      if (at > time && at <= time + maxWaitMs && !tombstone.getBoolean(v)) {
        out.add(decide(row, v, null));
        return true;
      }
    }
    out.add(decide(row, null, null));
    return true;
  }

  /** The record version current at {@code time} (null when none, or a tombstone). */
  private Row currentAt(List<Row> history, long time) {
    Row current = null;
    for (Row v : history) {
      if (versionMs.getLong(v) > time) {
        break;
      }
      current = v;
    }
    return current == null || tombstone.getBoolean(current) ? null : current;
  }

  /**
   * One timer per waiting order: past its time, or past its time + maxWait once it is due there;
   * at watermark 0, one at 1 as well, where the orders are judged against the future horizon.
   */
  private void registerTimers(List<Row> waits, List<Row> history, long watermark) {
    for (Row row : waits) {
      long time = eventMs.getLong(row);
      getHandle().registerTimer(watermark <= time ? time + 1 : time + maxWaitMs + 1);
    }
    if (watermark <= 0 && !waits.isEmpty()) {
      getHandle().registerTimer(1L);
    }
  }

  /** Prune the history, store it if it changed, and set a timer for the next pruning. */
  private void finish(List<Row> history, boolean changed, long watermark) {
    long horizon = watermark - allowedLatenessMs - maxWaitMs;
    int older = 0;
    while (older < history.size() && versionMs.getLong(history.get(older)) < horizon) {
      older++;
    }
    List<Row> kept = new ArrayList<>();
    if (older > 0 && !tombstone.getBoolean(history.get(older - 1))) {
      kept.add(history.get(older - 1));
    }
    kept.addAll(history.subList(older, history.size()));
    if (changed || kept.size() != history.size()) {
      Rows.replace(versions, kept);
    }
    if (kept.size() > 1) {  // when the watermark passes the newest version, the older ones can go
      getHandle().registerTimer(versionMs.getLong(kept.get(kept.size() - 1)) + allowedLatenessMs + maxWaitMs + 1);
    }
  }

  /** The version a changelog row makes: its time, its read order, and its record (or a tombstone). */
  private Row version(Row row, boolean isTombstone) {
    Object[] values = new Object[versionSchema.size()];
    versionMs.set(values, eventMs.getLong(row));
    for (int i = 0; i < columns.order.length; i++) {
      versionOrder[1 + i].set(values, columns.order[i].asLong(row));
    }
    tombstone.set(values, isTombstone);
    for (int i = 0; i < columns.state.length; i++) {
      versionState[i].set(values, isTombstone ? null : columns.state[i].get(row));
    }
    return new GenericRowWithSchema(values, versionSchema);
  }

  /** Whether the history holds a version of the same time and the same record (or tombstone). */
  private boolean holds(List<Row> history, Row version) {
    for (Row held : history) {
      if (versionMs.getLong(held) != versionMs.getLong(version)) {
        continue;
      }
      boolean same = true;
      for (int i = 0; i < versionIdentity.length && same; i++) {
        same = Objects.equals(versionIdentity[i].get(held), versionIdentity[i].get(version));
      }
      if (same) {
        return true;
      }
    }
    return false;
  }

  /**
   * The order decided: the version's state columns (nulls when none), as-of, found and waited;
   * {@code outcome} null for found or missing, as the version says.
   */
  private Row decide(Row row, Row version, LookupOutcome outcome) {
    Object[] values = Rows.values(row);
    for (int i = 0; i < columns.state.length; i++) {
      columns.state[i].set(values, version == null ? null : versionState[i].get(version));
    }
    long waited = 0L;
    if (version != null) {
      waited = Math.max(0L, versionMs.getLong(version) - eventMs.getLong(row));
    } else if (outcome == null) {
      waited = maxWaitMs;
    }
    asOf.set(values, version == null ? null : versionMs.getLong(version));
    LookupOutcome found = outcome != null ? outcome : version == null ? LookupOutcome.MISSING : LookupOutcome.FOUND;
    columns.found.set(values, found.value);
    long before = columns.waited.isNull(row) ? 0L : columns.waited.getLong(row);
    columns.waited.set(values, Math.max(before, waited));
    return new GenericRowWithSchema(values, columns.schema);
  }
}
