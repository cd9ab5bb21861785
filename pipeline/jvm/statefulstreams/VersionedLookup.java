package statefulstreams;

import java.util.ArrayList;
import java.util.Comparator;
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
  static final String LATE = "late";
  static final String FUTURE = "future";
  // The late column of an order: how its time stood when first judged.
  static final long ON_TIME_FLAG = 0L, LATE_FLAG = 1L, FUTURE_FLAG = 2L;

  private final ChangelogLookup.Columns columns;
  private final int eventMs, late, asOf;
  private final StructType versionSchema;  // version_ms, the read order columns, tombstone, state columns
  private final long maxWaitMs, allowedLatenessMs, futureAfterMs;
  private transient ListState<Row> versions;
  private transient ListState<Row> waiting;

  VersionedLookup(ChangelogLookup.Columns columns, String eventMs, String late, String asOf, long maxWaitMs,
                  long allowedLatenessMs, long futureAfterMs) {
    this.columns = columns;
    this.eventMs = columns.schema.fieldIndex(eventMs);
    this.late = columns.schema.fieldIndex(late);
    this.asOf = columns.schema.fieldIndex(asOf);
    this.maxWaitMs = maxWaitMs;
    this.allowedLatenessMs = allowedLatenessMs;
    this.futureAfterMs = futureAfterMs;
    List<StructField> fields = new ArrayList<>();
    fields.add(DataTypes.createStructField("version_ms", DataTypes.LongType, false));
    for (int i = 0; i < columns.order.length; i++) {
      fields.add(DataTypes.createStructField("read_" + i, DataTypes.LongType, true));
    }
    fields.add(DataTypes.createStructField("tombstone", DataTypes.BooleanType, false));
    fields.addAll(List.of(columns.stateSchema.fields()));
    this.versionSchema = DataTypes.createStructType(fields);
  }

  /**
   * The lookup as a streaming Dataset: {@code input} (which must carry an event-time watermark)
   * grouped by the key column and run through {@code transformWithState} in event time, append
   * mode. The output has the input's schema. Called on the driver, from Python through py4j.
   */
  public static Dataset<Row> apply(Dataset<Row> input, String key, String role, String state, String found,
                                   String firstSeen, String waited, String order, String eventMs, String late,
                                   String asOf, long maxWaitMs, long allowedLatenessMs, long futureAfterMs) {
    StructType schema = input.schema();
    ChangelogLookup.Columns columns = new ChangelogLookup.Columns(schema, key, role, state.split(","), found,
        firstSeen, waited, order.split(","));
    return KeyedByColumn.group(input, key, Encoders.LONG(), 0L)
        .transformWithState(new VersionedLookup(columns, eventMs, late, asOf, maxWaitMs, allowedLatenessMs,
                futureAfterMs),
            TimeMode.EventTime(), OutputMode.Append(), Encoders.row(schema));
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
    List<Row> out = new ArrayList<>();
    List<Row> history = load(versions);
    int before = history.size();
    List<Row> lookups = new ArrayList<>();
    List<Row> changes = new ArrayList<>();
    while (rows.hasNext()) {
      Row row = rows.next();
      String role = row.isNullAt(columns.role) ? "" : row.getString(columns.role);
      if (ChangelogLookup.SET.equals(role) || ChangelogLookup.DELETE.equals(role)) {
        changes.add(row);
      } else if (ChangelogLookup.LOOKUP.equals(role)) {
        lookups.add(row);
      } else {
        out.add(row);
      }
    }
    changes.sort(readOrder());  // of one time and one record, the first read is the one kept
    for (Row row : changes) {
      Row version = version(row, ChangelogLookup.DELETE.equals(row.getString(columns.role)));
      if (holds(history, version)) {
        continue;  // a replay re-reads versions already held: one copy each
      }
      history.add(version);
      if (version.getLong(0) < watermark - allowedLatenessMs) {
        out.add(with(row, late, 1L));  // a late version: stored, and emitted once to be counted
      }
    }
    history.sort(versionOrder());
    List<Row> waits = new ArrayList<>();
    for (Row row : lookups) {
      long time = row.getLong(eventMs);
      long flag = row.isNullAt(late) ? flag(time, watermark) : row.getLong(late);
      Row judged = with(row, late, flag);
      if (flag == LATE_FLAG) {
        out.add(decide(judged, null, LATE));
      } else if (flag == FUTURE_FLAG) {
        out.add(decide(judged, null, FUTURE));
      } else if (!decideIfDue(judged, history, watermark, out)) {
        waits.add(judged);
      }
    }
    registerTimers(waits, history, watermark);
    if (waiting.exists()) {
      // Orders already waiting may be due now that the key has new versions, and must be decided
      // before the history is pruned below (the model decides them in the same batch).
      List<Row> kept = new ArrayList<>();
      for (Row row : load(waiting)) {
        if (!decideIfDue(row, history, watermark, out)) {
          kept.add(row);
        }
      }
      kept.addAll(waits);
      if (kept.isEmpty()) {
        waiting.clear();
      } else {
        waiting.put(kept.toArray(new Row[0]));
      }
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
    List<Row> history = load(versions);
    history.sort(versionOrder());
    if (waiting.exists()) {
      List<Row> kept = new ArrayList<>();
      for (Row row : load(waiting)) {
        if (!decideIfDue(row, history, watermark, out)) {
          kept.add(row);
        }
      }
      if (kept.isEmpty()) {
        waiting.clear();
      } else {
        waiting.put(kept.toArray(new Row[0]));
      }
      registerTimers(kept, history, watermark);
    }
    finish(history, false, watermark);
    return CollectionConverters.asScala(out.iterator());
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
    long time = row.getLong(eventMs);
    if (isFuture(time, watermark)) {
      out.add(decide(with(row, late, FUTURE_FLAG), null, FUTURE));
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
      long at = v.getLong(0);
      if (at > time && at <= time + maxWaitMs && !isTombstone(v)) {
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
      if (v.getLong(0) > time) {
        break;
      }
      current = v;
    }
    return current == null || isTombstone(current) ? null : current;
  }

  /**
   * One timer per waiting order: past its time, or past its time + maxWait once it is due there;
   * at watermark 0, one at 1 as well, where the orders are judged against the future horizon.
   */
  private void registerTimers(List<Row> waits, List<Row> history, long watermark) {
    for (Row row : waits) {
      long time = row.getLong(eventMs);
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
    while (older < history.size() && history.get(older).getLong(0) < horizon) {
      older++;
    }
    List<Row> kept = new ArrayList<>();
    if (older > 0 && !isTombstone(history.get(older - 1))) {
      kept.add(history.get(older - 1));
    }
    kept.addAll(history.subList(older, history.size()));
    if (changed || kept.size() != history.size()) {
      if (kept.isEmpty()) {
        versions.clear();
      } else {
        versions.put(kept.toArray(new Row[0]));
      }
    }
    if (kept.size() > 1) {  // when the watermark passes the newest version, the older ones can go
      getHandle().registerTimer(kept.get(kept.size() - 1).getLong(0) + allowedLatenessMs + maxWaitMs + 1);
    }
  }

  private Row version(Row row, boolean tombstone) {
    Object[] values = new Object[versionSchema.size()];
    int i = 0;
    values[i++] = row.getLong(eventMs);
    for (int index : columns.order) {
      values[i++] = row.isNullAt(index) ? null : ((Number) row.get(index)).longValue();
    }
    values[i++] = tombstone;
    for (int index : columns.state) {
      values[i++] = tombstone ? null : row.get(index);
    }
    return new GenericRowWithSchema(values, versionSchema);
  }

  /** Whether the history holds a version of the same time and the same record (or tombstone). */
  private boolean holds(List<Row> history, Row version) {
    int first = 1 + columns.order.length;  // the tombstone flag, then the state columns
    for (Row held : history) {
      if (held.getLong(0) != version.getLong(0)) {
        continue;
      }
      boolean same = true;
      for (int i = first; i < versionSchema.size() && same; i++) {
        same = Objects.equals(held.get(i), version.get(i));
      }
      if (same) {
        return true;
      }
    }
    return false;
  }

  private boolean isTombstone(Row version) {
    return version.getBoolean(1 + columns.order.length);
  }

  /** Input rows by their read order columns. */
  private Comparator<Row> readOrder() {
    return (a, b) -> {
      for (int index : columns.order) {
        long x = a.isNullAt(index) ? Long.MIN_VALUE : ((Number) a.get(index)).longValue();
        long y = b.isNullAt(index) ? Long.MIN_VALUE : ((Number) b.get(index)).longValue();
        if (x != y) {
          return Long.compare(x, y);
        }
      }
      return 0;
    };
  }

  /** Versions by time, then read order (the later read of one time wins). */
  private Comparator<Row> versionOrder() {
    return (a, b) -> {
      for (int i = 0; i <= columns.order.length; i++) {
        long x = a.isNullAt(i) ? Long.MIN_VALUE : a.getLong(i);
        long y = b.isNullAt(i) ? Long.MIN_VALUE : b.getLong(i);
        if (x != y) {
          return Long.compare(x, y);
        }
      }
      return 0;
    };
  }

  /** The order decided: the version's state columns (nulls when none), as-of, found and waited. */
  private Row decide(Row row, Row version, String found) {
    Object[] values = values(row);
    int offset = 2 + columns.order.length;  // the state columns' position in a version row
    for (int i = 0; i < columns.state.length; i++) {
      values[columns.state[i]] = version == null ? null : version.get(offset + i);
    }
    long waited = 0L;
    if (version != null) {
      waited = Math.max(0L, version.getLong(0) - row.getLong(eventMs));
    } else if (found == null) {
      waited = maxWaitMs;
    }
    values[asOf] = version == null ? null : version.getLong(0);
    values[columns.found] = found != null ? found : version == null ? ChangelogLookup.MISSING : ChangelogLookup.FOUND;
    long before = row.isNullAt(columns.waited) ? 0L : row.getLong(columns.waited);
    values[columns.waited] = Math.max(before, waited);
    return new GenericRowWithSchema(values, columns.schema);
  }

  private Row with(Row row, int index, Object value) {
    Object[] values = values(row);
    values[index] = value;
    return new GenericRowWithSchema(values, columns.schema);
  }

  private static List<Row> load(ListState<Row> state) {
    List<Row> rows = new ArrayList<>();
    if (state.exists()) {
      CollectionConverters.asJava(state.get()).forEachRemaining(rows::add);
    }
    return rows;
  }

  private static Object[] values(Row row) {
    Object[] values = new Object[row.length()];
    for (int i = 0; i < values.length; i++) {
      values[i] = row.get(i);
    }
    return values;
  }
}
