package statefulstreams;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The head of a key in {@link VersionedLookup}: one value per key (ValueState {@code head}) that
 * holds the key's newest versions and what the operator must know to leave the rest unread:
 * <ul>
 *   <li>{@code recent}: the newest versions, at most {@link KeyHistory#RECENT}, oldest first
 *       (time, read order, tombstone, state columns): an order at or after the oldest of them
 *       reads nothing else, and a strictly newer version joins them, the oldest moving to the
 *       end of the {@code versions} list (an append, no read) when they are too many;</li>
 *   <li>{@code older}: how many versions the {@code versions} list holds (all before {@code recent});</li>
 *   <li>{@code prune_at}: the least pruning horizon past which pruning would drop something (the
 *       second version's time, or the first's when it is a tombstone; null when nothing ever goes);</li>
 *   <li>{@code waiting}: how many orders wait, and {@code due_ms}: the least watermark at which
 *       one of them may be due (or, seen at watermark 0, judged for the future);</li>
 *   <li>{@code queued}: the first of the waiting orders, at most {@link #QUEUED}, whole order rows
 *       in the order they came; the rest wait in the {@code waiting} list, which is not empty only
 *       when {@code queued} is full. The head is read and written in every call that adds or
 *       decides a waiting order anyway, so an order queued here costs no state call of its own:
 *       in the list it was an append (Spark's RocksDB reads the key before it merges), then a
 *       read and a clear (a read and a remove) once decided (issue 31: the waiting orders' list
 *       calls were a fifth of event time's extra CPU in a JFR profile);</li>
 *   <li>{@code prune_timer_ms}: the key's pruning timer (null when none), and {@code due_timer_ms}:
 *       a timer for its waiting orders, registered only when it is due before the pruning one, which
 *       stays registered (so a waiting order costs one timer register, no delete). These are the
 *       key's only timers; a time at or below the watermark is spent (fired, or firing in this
 *       batch) and is read as none.</li>
 * </ul>
 * A plain holder: the operator reads it once per call ({@link #read}) and writes it back when it
 * changed ({@link #toRow}).
 */
final class VersionHead {
  /**
   * Waiting orders a head holds; more wait in the list (an append, nothing read). A head is
   * rewritten whole by every call that changes it, so a few: most keys have one order waiting
   * at a time, and a key with many (a stalled watermark) appends the rest as before.
   */
  static final int QUEUED = 4;

  /** The state schema of heads whose versions have {@code versionSchema} and orders {@code orderSchema}. */
  static StructType schema(StructType versionSchema, StructType orderSchema) {
    return DataTypes.createStructType(List.of(
        DataTypes.createStructField("recent", DataTypes.createArrayType(versionSchema, false), false),
        DataTypes.createStructField("older", DataTypes.IntegerType, false),
        DataTypes.createStructField("prune_at", DataTypes.LongType, true),
        DataTypes.createStructField("waiting", DataTypes.IntegerType, false),
        DataTypes.createStructField("queued", DataTypes.createArrayType(orderSchema, false), false),
        DataTypes.createStructField("due_ms", DataTypes.LongType, true),
        DataTypes.createStructField("prune_timer_ms", DataTypes.LongType, true),
        DataTypes.createStructField("due_timer_ms", DataTypes.LongType, true)));
  }

  /** Where a head's parts sit in its row (found once, on the driver). */
  static final class Layout implements Serializable {
    private static final long serialVersionUID = 1L;
    final StructType schema, versionSchema;
    final int recent, older, pruneAt, waiting, queued, dueMs, pruneTimerMs, dueTimerMs;

    Layout(StructType versionSchema, StructType orderSchema) {
      this.versionSchema = versionSchema;
      this.schema = schema(versionSchema, orderSchema);
      this.recent = schema.fieldIndex("recent");
      this.older = schema.fieldIndex("older");
      this.pruneAt = schema.fieldIndex("prune_at");
      this.waiting = schema.fieldIndex("waiting");
      this.queued = schema.fieldIndex("queued");
      this.dueMs = schema.fieldIndex("due_ms");
      this.pruneTimerMs = schema.fieldIndex("prune_timer_ms");
      this.dueTimerMs = schema.fieldIndex("due_timer_ms");
    }
  }

  List<Row> recent = new ArrayList<>();  // rows of the version schema, oldest first
  int older;
  Long pruneAt;
  int waiting;
  List<Row> queued = new ArrayList<>();  // order rows, the first waiting ones, at most QUEUED
  Long dueMs;
  Long pruneTimerMs;
  Long dueTimerMs;
  /** Whether the key had a head when read (so an empty one is cleared, not written). */
  final boolean existed;

  private VersionHead(boolean existed) {
    this.existed = existed;
  }

  /**
   * The head a state row holds ({@code row} null: a key with nothing held yet); its timers at or
   * below {@code watermark} are spent and read as none.
   */
  static VersionHead read(Row row, Layout layout, long watermark) {
    VersionHead head = new VersionHead(row != null);
    if (row == null) {
      return head;
    }
    head.recent.addAll(row.<Row>getList(layout.recent));
    head.older = row.getInt(layout.older);
    head.pruneAt = row.isNullAt(layout.pruneAt) ? null : row.getLong(layout.pruneAt);
    head.waiting = row.getInt(layout.waiting);
    head.queued.addAll(row.<Row>getList(layout.queued));
    head.dueMs = row.isNullAt(layout.dueMs) ? null : row.getLong(layout.dueMs);
    head.pruneTimerMs = pending(row, layout.pruneTimerMs, watermark);
    head.dueTimerMs = pending(row, layout.dueTimerMs, watermark);
    return head;
  }

  private static Long pending(Row row, int index, long watermark) {
    return row.isNullAt(index) || row.getLong(index) <= watermark ? null : row.getLong(index);
  }

  /** How many waiting orders are in the {@code waiting} list (none unless {@link #queued} is full). */
  int listed() {
    return waiting - queued.size();
  }

  /** Whether the head holds nothing: no version, no waiting order, no timer. */
  boolean isEmpty() {
    return recent.isEmpty() && older == 0 && waiting == 0 && pruneTimerMs == null && dueTimerMs == null;
  }

  /** The head as a state row. */
  Row toRow(Layout layout) {
    Object[] values = new Object[layout.schema.size()];
    values[layout.recent] = recent.toArray(new Row[0]);
    values[layout.older] = older;
    values[layout.pruneAt] = pruneAt;
    values[layout.waiting] = waiting;
    values[layout.queued] = queued.toArray(new Row[0]);
    values[layout.dueMs] = dueMs;
    values[layout.pruneTimerMs] = pruneTimerMs;
    values[layout.dueTimerMs] = dueTimerMs;
    return new GenericRowWithSchema(values, layout.schema);
  }
}
