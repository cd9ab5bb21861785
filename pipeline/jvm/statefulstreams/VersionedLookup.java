package statefulstreams;

import java.util.ArrayList;
import java.util.List;

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
import org.apache.spark.sql.streaming.ValueState;
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
 * <p>State per key, in the RocksDB state store: {@code head} (ValueState, {@link VersionHead}: the
 * newest versions, up to {@link KeyHistory#RECENT}, and the counts and times that let a call leave
 * the rest unread, and the first few waiting orders), {@code versions} (ListState: the older
 * versions, oldest first: time, read order, tombstone flag and the state columns) and
 * {@code waiting} (ListState, whole order rows: the waiting orders beyond the head's few),
 * plus at most two event-time timers per key. What a call reads and writes ({@link KeyHistory}; issue 31:
 * the backlog read 0.61 x processing time when every call loaded, sorted and rewrote the list):
 * <ul>
 *   <li>a version strictly newer than every held one (the usual case) joins the head's; the
 *       head's oldest is appended to the list (nothing read) once they are more than
 *       {@link KeyHistory#RECENT}; only an older or equal-time version (out of order, a replay)
 *       loads the list, which is then written back whole;</li>
 *   <li>an order at or after the head's oldest version reads the head only; an earlier one
 *       loads the list (a key with few versions has none);</li>
 *   <li>the waiting orders are looked at only when the key has new versions, one of them may be
 *       due or its history is to be pruned; a new waiting order joins the head's first
 *       {@link VersionHead#QUEUED} (read and written anyway), else is appended to the list, which
 *       is read only when it holds some;</li>
 *   <li>the key's timers ({@link KeyTimers}): one at the time pruning would drop something
 *       (prune_at + allowedLateness + maxWait + 1), left registered while orders wait, and one
 *       at the waiting orders' least due time only when that is earlier. A key holding one
 *       version has no pruning timer, so a watermark that jumps past a backlog fires only the
 *       keys with something to drop, and a key whose newest version is older than the horizon
 *       drops its list unread.</li>
 * </ul>
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
 *       state, and a later lookup passes it on as late. Late orders are never dropped. With
 *       {@code joinLate} (the SQL temporal join) it is emitted at once decided with the versions
 *       the key still holds instead, its late column 1.</li>
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
 *       missing (waited = maxWait). Until then it waits, under the key's timers; the orders
 *       waiting on a key are looked at again when the key has new versions (one may make an
 *       order due) and when the least due time of them has come.</li>
 *   <li>At the end of every batch, each key holds no version older than watermark -
 *       allowedLateness - maxWait but the newest of them (still current there), and that one
 *       only if it is a record: pruned in the key's call when it has input, else by its timer.
 *       So the history is the model's after every batch, whether the key was touched or not
 *       (which versions a replay re-adds, and which late versions are counted, depend on it).</li>
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
  private final boolean joinLate;
  // A version row: version_ms, the read order columns (read_0, ...), tombstone, the state columns.
  private final KeyHistory.Columns version;
  private transient ListState<Row> versions;
  private transient ListState<Row> waiting;
  private final VersionHead.Layout headLayout;
  private transient ValueState<Row> headState;

  VersionedLookup(LookupColumns columns, LookupSpec spec) {
    this.columns = columns;
    this.eventMs = new Field(columns.schema, spec.eventMs);
    this.late = new Field(columns.schema, spec.late);
    this.asOf = new Field(columns.schema, spec.asOf);
    this.maxWaitMs = spec.maxWaitMs;
    this.allowedLatenessMs = spec.allowedLatenessMs;
    this.futureAfterMs = spec.futureAfterMs;
    this.joinLate = spec.joinLate;
    this.version = new KeyHistory.Columns(columns);
    this.headLayout = new VersionHead.Layout(version.schema, columns.schema);
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
    versions = getHandle().getListState("versions", Encoders.row(version.schema), TTLConfig.NONE());
    waiting = getHandle().getListState("waiting", Encoders.row(columns.schema), TTLConfig.NONE());
    headState = getHandle().getValueState("head", Encoders.row(headLayout.schema), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(Long key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    long watermark = Math.max(0L, timerValues.getCurrentWatermarkInMs());
    Rows.Split split = Rows.split(rows, row -> columns.roleOf(row).part);
    List<Row> out = split.passed;
    if (split.changes.isEmpty() && decidedWithoutState(split.lookups, watermark, out)) {
      return CollectionConverters.asScala(out.iterator());
    }
    KeyCall call = new KeyCall(watermark);
    split.changes.sort(Rows.readOrder(columns.order));  // of one time and one record, the first read is the one kept
    boolean added = false;
    for (Row row : split.changes) {
      Row made = version(row, columns.roleOf(row) == LookupRole.DELETE);
      if (!call.history.add(made)) {
        continue;  // a replay re-reads versions already held: one copy each
      }
      added = true;
      if (version.versionMs.getLong(made) < watermark - allowedLatenessMs) {
        out.add(Rows.with(row, late, 1L, columns.schema));  // a late version: stored, and emitted once to be counted
      }
    }
    List<Row> waits = new ArrayList<>();
    for (Row row : split.lookups) {
      long time = eventMs.getLong(row);
      long flag = late.isNull(row) ? flag(time, watermark) : late.getLong(row);
      Row judged = Rows.with(row, late, flag, columns.schema);
      if (flag == LATE_FLAG) {
        out.add(joinLate ? decideWithHeld(judged, call) : decide(judged, null, LookupOutcome.LATE));
      } else if (flag == FUTURE_FLAG) {
        out.add(decide(judged, null, LookupOutcome.FUTURE));
      } else if (!decideIfDue(judged, call, watermark, out)) {
        waits.add(judged);
      }
    }
    call.decideWaitingIfDue(added, watermark, out);
    call.addWaiting(waits, watermark);
    call.finish(watermark);
    return CollectionConverters.asScala(out.iterator());
  }

  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(Long key, TimerValues timerValues,
                                                           ExpiredTimerInfo expiredTimerInfo) {
    long watermark = Math.max(0L, timerValues.getCurrentWatermarkInMs());
    List<Row> out = new ArrayList<>();
    KeyCall call = new KeyCall(watermark);  // the firing timer is spent: Spark removes it
    call.decideWaitingIfDue(false, watermark, out);
    call.finish(watermark);
    return CollectionConverters.asScala(out.iterator());
  }

  /**
   * One call's view of a key: its head, read once; its versions ({@link KeyHistory}); and
   * whether the head changed.
   */
  private final class KeyCall {
    final VersionHead head;
    final KeyHistory history;
    boolean headChanged;

    KeyCall(long watermark) {
      this.head = VersionHead.read(headState.get(), headLayout, watermark);
      this.history = new KeyHistory(version, head, versions);
    }

    /**
     * Orders already waiting may be due now that the key has new versions ({@code added}), or
     * by their due time, and must be decided before the history is pruned (the model decides
     * them in the same batch). Otherwise they are left unread.
     */
    void decideWaitingIfDue(boolean added, long watermark, List<Row> out) {
      if (head.waiting > 0 && (added || head.dueMs <= watermark || history.prunable(pruneHorizon(watermark)))) {
        decideWaiting(watermark, out);
      }
    }

    /**
     * Decide the waiting orders that are due (adding them to {@code out}); keep the others, the
     * first {@link VersionHead#QUEUED} in the head, the rest in the list (read only when it holds
     * some, written only when what it holds changed).
     */
    void decideWaiting(long watermark, List<Row> out) {
      List<Row> listed = head.listed() > 0 ? KeyHistory.loadHeld(waiting) : List.of();
      List<Row> kept = new ArrayList<>();
      for (List<Row> rows : List.of(head.queued, listed)) {  // in the order they came
        for (Row row : rows) {
          if (!decideIfDue(row, this, watermark, out)) {
            kept.add(row);
          }
        }
      }
      int queued = Math.min(VersionHead.QUEUED, kept.size());
      List<Row> rest = kept.subList(queued, kept.size());
      // rest is what the list keeps, in order: it is the list unchanged only when as long
      if (rest.size() != listed.size()) {
        Rows.replace(waiting, rest);
      }
      head.queued = new ArrayList<>(kept.subList(0, queued));
      head.waiting = kept.size();
      head.dueMs = null;
      for (Row row : kept) {
        head.dueMs = min(head.dueMs, dueAt(eventMs.getLong(row), watermark));
      }
      headChanged = true;
    }

    /**
     * Orders that must wait: into the head while it has room, else appended to the waiting list
     * (nothing read). The list holds orders only when the head's are full, so they stay in the
     * order they came.
     */
    void addWaiting(List<Row> waits, long watermark) {
      for (Row row : waits) {
        if (head.queued.size() < VersionHead.QUEUED) {
          head.queued.add(row);
        } else {
          waiting.appendValue(row);
        }
        head.waiting++;
        head.dueMs = min(head.dueMs, dueAt(eventMs.getLong(row), watermark));
        headChanged = true;
      }
    }

    /** Prune the history if the watermark allows, store what changed, and place the key's timers. */
    void finish(long watermark) {
      long horizon = pruneHorizon(watermark);
      if (history.prunable(horizon)) {
        history.prune(horizon);
      }
      history.store();
      headChanged |= history.headChanged;
      Long due = head.waiting > 0 ? head.dueMs : null;
      // when the horizon passes prune_at, something can go
      Long prune = head.pruneAt == null ? null : head.pruneAt + allowedLatenessMs + maxWaitMs + 1;
      headChanged |= KeyTimers.place(head, due, prune, getHandle());
      if (head.isEmpty()) {
        if (head.existed) {
          headState.clear();
        }
      } else if (headChanged) {
        headState.update(head.toRow(headLayout));
      }
    }
  }

  /**
   * A call with no version whose orders are all decided at once with no state (late, unless
   * {@code joinLate}; from the future): their decisions added to {@code out}, and true; else
   * false, with nothing added. Such a call reads and writes nothing (issue 31: a replay or a
   * catch-up re-reads late orders in bulk, each a head read for nothing). Whatever else the key
   * has due in this batch (waiting orders, pruning) its timer does, as for a key with no input:
   * {@link KeyTimers} keeps one registered at or before it.
   */
  private boolean decidedWithoutState(List<Row> lookups, long watermark, List<Row> out) {
    List<Row> decided = new ArrayList<>();
    for (Row row : lookups) {
      long flag = late.isNull(row) ? flag(eventMs.getLong(row), watermark) : late.getLong(row);
      if (flag == ON_TIME_FLAG || (flag == LATE_FLAG && joinLate)) {
        return false;
      }
      Row judged = Rows.with(row, late, flag, columns.schema);
      decided.add(decide(judged, null, flag == LATE_FLAG ? LookupOutcome.LATE : LookupOutcome.FUTURE));
    }
    out.addAll(decided);
    return true;
  }

  /** Versions older than this go at {@code watermark} ({@code event_rules.prune_horizon}). */
  private long pruneHorizon(long watermark) {
    return watermark - allowedLatenessMs - maxWaitMs;
  }

  /**
   * The watermark at which a waiting order may be due: past its time, or past its time + maxWait
   * once there; at watermark 0, 1 at the latest (it is judged against the future horizon there).
   */
  private long dueAt(long time, long watermark) {
    long due = watermark <= time ? time + 1 : time + maxWaitMs + 1;
    return watermark <= 0 ? Math.min(due, 1L) : due;
  }

  private static Long min(Long a, Long b) {
    return a == null ? b : b == null ? a : Long.valueOf(Math.min(a, b));
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
   * order first judged at watermark 0 can turn out so here), or due; false if it must wait. An
   * order at or after the oldest version in the key's head reads nothing but the head.
   */
  private boolean decideIfDue(Row row, KeyCall call, long watermark, List<Row> out) {
    long time = eventMs.getLong(row);
    if (isFuture(time, watermark)) {
      out.add(decide(Rows.with(row, late, FUTURE_FLAG, columns.schema), null, LookupOutcome.FUTURE));
      return true;
    }
    if (watermark <= time) {
      return false;
    }
    List<Row> held = call.history.covering(time);
    Row current = currentAt(held, time);
    if (current == null && maxWaitMs > 0 && watermark <= time + maxWaitMs) {
      return false;
    }
    out.add(decideWith(row, held, current, time));
    return true;
  }

  /** A late order decided now with the versions the key holds (option {@code joinLate}). */
  private Row decideWithHeld(Row row, KeyCall call) {
    long time = eventMs.getLong(row);
    List<Row> held = call.history.covering(time);
    return decideWith(row, held, currentAt(held, time), time);
  }

  /**
   * An order decided with {@code held}: {@code current} (the record current at its time, as
   * {@link #currentAt} found it), or the first record within maxWait after it, or missing.
   */
  private Row decideWith(Row row, List<Row> held, Row current, long time) {
    if (current != null) {
      return decide(row, current, null);
    }
    for (Row v : held) {
      long at = version.versionMs.getLong(v);
      if (at > time && at <= time + maxWaitMs && !version.tombstone.getBoolean(v)) {
        return decide(row, v, null);
      }
    }
    return decide(row, null, null);
  }

  /** The record version current at {@code time} in {@code held} (null when none, or a tombstone). */
  private Row currentAt(List<Row> held, long time) {
    Row current = null;
    for (Row v : held) {
      if (version.versionMs.getLong(v) > time) {
        break;
      }
      current = v;
    }
    return current == null || version.tombstone.getBoolean(current) ? null : current;
  }

  /** The version a changelog row makes: its time, its read order, and its record (or a tombstone). */
  private Row version(Row row, boolean isTombstone) {
    Object[] values = new Object[version.schema.size()];
    version.versionMs.set(values, eventMs.getLong(row));
    for (int i = 0; i < columns.order.length; i++) {
      version.order[1 + i].set(values, columns.order[i].asLong(row));
    }
    version.tombstone.set(values, isTombstone);
    for (int i = 0; i < columns.state.length; i++) {
      version.state[i].set(values, isTombstone ? null : columns.state[i].get(row));
    }
    return new GenericRowWithSchema(values, version.schema);
  }

  /**
   * The order decided: the version's state columns (nulls when none), as-of, found and waited;
   * {@code outcome} null for found or missing, as the version says.
   */
  private Row decide(Row row, Row used, LookupOutcome outcome) {
    Object[] values = Rows.values(row);
    for (int i = 0; i < columns.state.length; i++) {
      columns.state[i].set(values, used == null ? null : version.state[i].get(used));
    }
    long waited = 0L;
    if (used != null) {
      waited = Math.max(0L, version.versionMs.getLong(used) - eventMs.getLong(row));
    } else if (outcome == null) {
      waited = maxWaitMs;
    }
    asOf.set(values, used == null ? null : version.versionMs.getLong(used));
    LookupOutcome found = outcome != null ? outcome : used == null ? LookupOutcome.MISSING : LookupOutcome.FOUND;
    columns.found.set(values, found.value);
    long before = columns.waited.isNull(row) ? 0L : columns.waited.getLong(row);
    columns.waited.set(values, Math.max(before, waited));
    return new GenericRowWithSchema(values, columns.schema);
  }
}
