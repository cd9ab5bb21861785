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
import org.apache.spark.sql.streaming.ValueState;
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
 * <p>State per key, in the RocksDB state store: {@code head} (ValueState, {@link VersionHead}: the
 * newest version, and the counts and times that let a call leave the rest unread),
 * {@code versions} (ListState: the older versions, oldest first: time, read order, tombstone flag
 * and the state columns) and {@code waiting} (ListState, whole order rows), plus one event-time
 * timer per key. What a call reads and writes (issue 31: the backlog read 0.61 x processing time
 * when every call loaded, sorted and rewrote the list):
 * <ul>
 *   <li>a version strictly newer than every held one (the usual case) is appended to the list
 *       (the old newest) and becomes the head; only an older or equal-time version (out of
 *       order, a replay) loads the list, which is then written back whole;</li>
 *   <li>an order at or after the newest version reads the head only; an earlier one loads the list;</li>
 *   <li>the waiting orders are read only when the key has new versions, its timer is due or its
 *       history is to be pruned; a new waiting order is appended;</li>
 *   <li>the key's one timer is the least of its waiting orders' due times and the time pruning
 *       would drop something (prune_at + allowedLateness + maxWait + 1); a replaced timer is
 *       deleted. A key holding one version has no pruning timer, so a watermark that jumps past
 *       a backlog fires only the keys with something to drop, and a key whose newest version
 *       is older than the horizon drops its list unread.</li>
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
 *       missing (waited = maxWait). Until then it waits, under the key's timer; the orders
 *       waiting on a key are looked at again when the key has new versions (one may make an
 *       order due) and when its timer is due.</li>
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
  // A version row: version_ms, the read order columns (read_0, ...), tombstone, the state columns.
  private final StructType versionSchema;
  private final Field versionMs, tombstone;
  private final Field[] versionOrder;  // version_ms, then the read order columns
  private final Field[] versionState;
  private final Field[] versionIdentity;  // tombstone and state: what makes two versions of one time the same
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
    this.headLayout = new VersionHead.Layout(versionSchema);
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
    headState = getHandle().getValueState("head", Encoders.row(headLayout.schema), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(Long key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    long watermark = Math.max(0L, timerValues.getCurrentWatermarkInMs());
    KeyCall call = new KeyCall(null);
    Rows.Split split = Rows.split(rows, row -> columns.roleOf(row).part);
    List<Row> out = split.passed;
    split.changes.sort(Rows.readOrder(columns.order));  // of one time and one record, the first read is the one kept
    boolean added = false;
    for (Row row : split.changes) {
      Row version = version(row, columns.roleOf(row) == LookupRole.DELETE);
      if (!call.add(version)) {
        continue;  // a replay re-reads versions already held: one copy each
      }
      added = true;
      if (versionMs.getLong(version) < watermark - allowedLatenessMs) {
        out.add(Rows.with(row, late, 1L, columns.schema));  // a late version: stored, and emitted once to be counted
      }
    }
    List<Row> waits = new ArrayList<>();
    for (Row row : split.lookups) {
      long time = eventMs.getLong(row);
      long flag = late.isNull(row) ? flag(time, watermark) : late.getLong(row);
      Row judged = Rows.with(row, late, flag, columns.schema);
      if (flag == LATE_FLAG) {
        out.add(decide(judged, null, LookupOutcome.LATE));
      } else if (flag == FUTURE_FLAG) {
        out.add(decide(judged, null, LookupOutcome.FUTURE));
      } else if (!decideIfDue(judged, call, watermark, out)) {
        waits.add(judged);
      }
    }
    // Orders already waiting may be due now that the key has new versions, or by the key's timer
    // (which finish may replace), and must be decided before the history is pruned (the model
    // decides them in the same batch). Otherwise they are left unread.
    if (call.head.waiting > 0 && (added || call.timerDue(watermark) || call.prunable(watermark))) {
      call.decideWaiting(watermark, out);
    }
    call.addWaiting(waits, watermark);
    call.finish(watermark);
    return CollectionConverters.asScala(out.iterator());
  }

  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(Long key, TimerValues timerValues,
                                                           ExpiredTimerInfo expiredTimerInfo) {
    long watermark = Math.max(0L, timerValues.getCurrentWatermarkInMs());
    List<Row> out = new ArrayList<>();
    KeyCall call = new KeyCall(expiredTimerInfo.getExpiryTimeInMs());
    if (call.head.waiting > 0) {
      call.decideWaiting(watermark, out);
    }
    call.finish(watermark);
    return CollectionConverters.asScala(out.iterator());
  }

  /**
   * One call's view of a key: its head, read once; its history (every version, oldest first),
   * read only when a decision or a pruning needs more than the newest version; and what changed.
   */
  private final class KeyCall {
    final VersionHead head;
    /** The timer Spark is firing in this call (it removes it itself), or null. */
    final Long firing;
    List<Row> history;  // null until loaded
    int olderLoaded;  // the versions list's length when loaded
    boolean historyChanged, headChanged;

    KeyCall(Long firing) {
      this.head = VersionHead.read(headState.get(), headLayout);
      this.firing = firing;
      if (firing != null && firing.equals(head.timerMs)) {
        head.timerMs = null;
        headChanged = true;
      }
    }

    /** Every version held, oldest first (the versions list, then the newest), loaded once. */
    List<Row> history() {
      if (history == null) {
        history = head.older > 0 ? Rows.load(versions) : new ArrayList<>();
        olderLoaded = history.size();
        if (head.newest != null) {
          history.add(head.newest);
        }
        history.sort(Rows.readOrder(versionOrder));
      }
      return history;
    }

    /**
     * Add a version unless the key holds it; false when it does. A version strictly newer than
     * every held one (the usual case) becomes the head's newest and the old newest is appended
     * to the list, with nothing read.
     */
    boolean add(Row version) {
      Row newest = head.newest;
      if (history == null && (newest == null || versionMs.getLong(version) > versionMs.getLong(newest))) {
        if (newest == null) {
          head.pruneAt = tombstone.getBoolean(version) ? versionMs.getLong(version) : null;
        } else {
          versions.appendValue(newest);
          if (head.older == 0) {  // the old newest is now the first version, the new one the second
            head.pruneAt = tombstone.getBoolean(newest) ? versionMs.getLong(newest) : versionMs.getLong(version);
          }
          head.older++;
        }
        head.newest = version;
        headChanged = true;
        return true;
      }
      List<Row> all = history();
      if (holds(all, version)) {
        return false;
      }
      all.add(version);
      all.sort(Rows.readOrder(versionOrder));
      head.newest = all.get(all.size() - 1);  // the head's newest stays the history's (decideIfDue reads it)
      historyChanged = true;
      return true;
    }

    /** Whether the key's timer is due at {@code watermark} (Spark fires it in this batch). */
    boolean timerDue(long watermark) {
      return head.timerMs != null && head.timerMs <= watermark;
    }

    /** Whether pruning at {@code watermark} would drop something. */
    boolean prunable(long watermark) {
      return head.pruneAt != null && head.pruneAt < pruneHorizon(watermark);
    }

    /** Decide the waiting orders that are due (adding them to {@code out}); keep the others. */
    void decideWaiting(long watermark, List<Row> out) {
      List<Row> kept = new ArrayList<>();
      for (Row row : Rows.load(waiting)) {
        if (!decideIfDue(row, this, watermark, out)) {
          kept.add(row);
        }
      }
      if (kept.size() != head.waiting) {
        Rows.replace(waiting, kept);
      }
      head.waiting = kept.size();
      head.dueMs = null;
      for (Row row : kept) {
        head.dueMs = min(head.dueMs, dueAt(eventMs.getLong(row), watermark));
      }
      headChanged = true;
    }

    /** Orders that must wait, appended to the waiting list (nothing read). */
    void addWaiting(List<Row> waits, long watermark) {
      for (Row row : waits) {
        waiting.appendValue(row);
        head.waiting++;
        head.dueMs = min(head.dueMs, dueAt(eventMs.getLong(row), watermark));
        headChanged = true;
      }
    }

    /** Prune the history if the watermark allows, store what changed, and set the key's one timer. */
    void finish(long watermark) {
      if (historyChanged) {
        head.pruneAt = pruneAtOf(history);  // an older version added may make something prunable
      }
      if (prunable(watermark)) {
        prune(pruneHorizon(watermark));
      }
      if (historyChanged) {
        storeHistory();
      }
      Long wanted = null;
      if (head.waiting > 0) {
        // at watermark 0, at 1 as well: the orders are judged against the future horizon there
        wanted = watermark <= 0 ? min(head.dueMs, 1L) : head.dueMs;
      }
      if (head.pruneAt != null) {  // when the horizon passes prune_at, something can go
        wanted = min(wanted, head.pruneAt + allowedLatenessMs + maxWaitMs + 1);
      }
      if (!Objects.equals(wanted, head.timerMs)) {
        if (head.timerMs != null) {
          getHandle().deleteTimer(head.timerMs);
        }
        if (wanted != null) {
          getHandle().registerTimer(wanted);
        }
        head.timerMs = wanted;
        headChanged = true;
      }
      if (head.isEmpty()) {
        if (head.existed) {
          headState.clear();
        }
      } else if (headChanged) {
        headState.update(head.toRow(headLayout));
      }
    }

    /**
     * Versions older than {@code horizon} go, except the newest of them unless it is a tombstone
     * ({@code event_rules.prune_versions}). When the newest version is older too, the list goes
     * whole, unread.
     */
    void prune(long horizon) {
      if (history == null && versionMs.getLong(head.newest) < horizon) {
        if (head.older > 0) {
          versions.clear();
          head.older = 0;
        }
        if (tombstone.getBoolean(head.newest)) {
          head.newest = null;
        }
        head.pruneAt = null;
        headChanged = true;
        return;
      }
      List<Row> all = history();
      int older = 0;
      while (older < all.size() && versionMs.getLong(all.get(older)) < horizon) {
        older++;
      }
      List<Row> kept = new ArrayList<>();
      if (older > 0 && !tombstone.getBoolean(all.get(older - 1))) {
        kept.add(all.get(older - 1));
      }
      kept.addAll(all.subList(older, all.size()));
      history = kept;
      head.newest = kept.isEmpty() ? null : kept.get(kept.size() - 1);
      historyChanged = true;
    }

    /** The loaded history as the list (all but the newest) and the head (the newest, prune_at). */
    void storeHistory() {
      int n = history.size();
      List<Row> older = history.subList(0, Math.max(0, n - 1));
      if (older.isEmpty()) {
        if (olderLoaded > 0) {
          versions.clear();
        }
      } else {
        versions.put(older.toArray(new Row[0]));
      }
      head.older = older.size();
      head.newest = n == 0 ? null : history.get(n - 1);
      head.pruneAt = pruneAtOf(history);
      headChanged = true;
    }
  }

  /**
   * The least pruning horizon past which pruning {@code history} (oldest first) drops something:
   * its first version's time when that is a tombstone, else its second's; null when it has one
   * record or nothing.
   */
  private Long pruneAtOf(List<Row> history) {
    if (history.isEmpty()) {
      return null;
    }
    if (tombstone.getBoolean(history.get(0))) {
      return versionMs.getLong(history.get(0));
    }
    return history.size() > 1 ? Long.valueOf(versionMs.getLong(history.get(1))) : null;
  }

  /** Versions older than this go at {@code watermark} ({@code event_rules.prune_horizon}). */
  private long pruneHorizon(long watermark) {
    return watermark - allowedLatenessMs - maxWaitMs;
  }

  /** The watermark at which a waiting order may be due: past its time, or past its time + maxWait once there. */
  private long dueAt(long time, long watermark) {
    return watermark <= time ? time + 1 : time + maxWaitMs + 1;
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
   * order at or after the newest version, a record, reads nothing but the key's head.
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
    Row newest = call.head.newest;
    if (newest != null && versionMs.getLong(newest) <= time && !tombstone.getBoolean(newest)) {
      out.add(decide(row, newest, null));
      return true;
    }
    List<Row> history = call.history();
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
