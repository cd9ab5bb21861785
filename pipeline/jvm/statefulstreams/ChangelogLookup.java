package statefulstreams;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
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
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

/**
 * A keyed lookup over a changelog: keeps the latest record per key and attaches it to the rows
 * that ask for it, making them wait (up to a bound) for a key that is not there yet.
 *
 * <p>It knows nothing of users or items. Python describes a lookup with column names
 * ({@link Columns}) and uses this class once per lookup. Every input row has a role, read from
 * the role column:
 * <ul>
 *   <li>{@code set}: a changelog upsert; its state columns become the key's latest record;</li>
 *   <li>{@code delete}: a tombstone; the key's record is removed;</li>
 *   <li>{@code lookup}: a row to enrich with the key's record (an order);</li>
 *   <li>anything else: passed through unchanged (dead letters, another lookup's changelog).</li>
 * </ul>
 *
 * <p>State per key, in the RocksDB state store: {@code latest} (ValueState, the record's state
 * columns) and {@code waiting} (ListState, whole rows that wait for the key), plus one
 * processing-time timer per distinct deadline of a waiting row.
 *
 * <p>Call order and guarantees (Spark calls {@code handleInputRows} once per key with input in a
 * batch, then {@code handleExpiredTimer} once per due timer):
 * <ol>
 *   <li>A batch's changes for a key apply before its lookups, in read order (the order columns),
 *       so the last change of the batch wins.</li>
 *   <li>When a change leaves a record, every row waiting for the key is released with it.</li>
 *   <li>A lookup row whose key has a record is emitted with the record and the found column set
 *       to {@code found}. Otherwise, while {@code now - firstSeen < maxWaitMs} it waits; after that
 *       (or at once when maxWaitMs is 0) it is emitted with null state and {@code missing}.</li>
 *   <li>Every emitted lookup row has firstSeen set (to the batch time when it was null) and
 *       waited = now - firstSeen, so a second lookup continues the same clock.</li>
 * </ol>
 * These are the decisions specified in {@code pipeline/enrich/rules.py} ({@code LookupModel}); a
 * model-based test holds this class to them. Rows are never dropped: each input row is either
 * passed through, emitted as a lookup result, or held in {@code waiting} until it is.
 */
public final class ChangelogLookup extends StatefulProcessor<Long, Row, Row> {
  private static final long serialVersionUID = 1L;

  /** Roles of input rows (the values of the role column). */
  static final String SET = "set", DELETE = "delete", LOOKUP = "lookup";
  /** Values written to the found column. */
  static final String FOUND = "found", MISSING = "missing";

  /** Column positions of one lookup in the row schema (shared by input, output and waiting rows). */
  static final class Columns implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final StructType schema;
    final StructType stateSchema;
    final int key, role, found, firstSeen, waited;
    final int[] state, order;

    Columns(StructType schema, String key, String role, String[] state, String found, String firstSeen,
            String waited, String[] order) {
      this.schema = schema;
      this.key = schema.fieldIndex(key);
      this.role = schema.fieldIndex(role);
      this.found = schema.fieldIndex(found);
      this.firstSeen = schema.fieldIndex(firstSeen);
      this.waited = schema.fieldIndex(waited);
      this.state = Arrays.stream(state).mapToInt(schema::fieldIndex).toArray();
      this.order = Arrays.stream(order).mapToInt(schema::fieldIndex).toArray();
      this.stateSchema = new StructType(Arrays.stream(this.state).mapToObj(i -> schema.fields()[i])
          .toArray(StructField[]::new));
    }
  }

  private final Columns columns;
  private final long maxWaitMs;
  private transient ValueState<Row> latest;
  private transient ListState<Row> waiting;

  public ChangelogLookup(Columns columns, long maxWaitMs) {
    this.columns = columns;
    this.maxWaitMs = maxWaitMs;
  }

  /**
   * The lookup as a streaming Dataset: {@code input} grouped by the key column and run through
   * {@code transformWithState} in processing time, append mode. The output has the input's schema.
   * Called on the driver, from Python through py4j; list arguments are comma-separated names.
   */
  public static Dataset<Row> apply(Dataset<Row> input, String key, String role, String state, String found,
                                   String firstSeen, String waited, String order, long maxWaitMs) {
    StructType schema = input.schema();
    Columns columns = new Columns(schema, key, role, state.split(","), found, firstSeen, waited,
        order.split(","));
    return KeyedByColumn.group(input, key, Encoders.LONG(), 0L)
        .transformWithState(new ChangelogLookup(columns, maxWaitMs), TimeMode.ProcessingTime(),
            OutputMode.Append(), Encoders.row(schema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    latest = getHandle().getValueState("latest", Encoders.row(columns.stateSchema), TTLConfig.NONE());
    waiting = getHandle().getListState("waiting", Encoders.row(columns.schema), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(Long key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    long now = timerValues.getCurrentProcessingTimeInMs();
    List<Row> out = new ArrayList<>();
    List<Row> changes = new ArrayList<>();
    List<Row> lookups = new ArrayList<>();
    while (rows.hasNext()) {
      Row row = rows.next();
      String role = row.isNullAt(columns.role) ? "" : row.getString(columns.role);
      if (SET.equals(role) || DELETE.equals(role)) {
        changes.add(row);
      } else if (LOOKUP.equals(role)) {
        lookups.add(row);
      } else {
        out.add(row);
      }
    }
    Row record = null;
    if (!changes.isEmpty()) {
      record = applyChanges(changes);
      if (record != null && waiting.exists()) {
        Row arrived = record;
        CollectionConverters.asJava(waiting.get()).forEachRemaining(row -> out.add(complete(row, arrived, now)));
        waiting.clear();
        CollectionConverters.asJava(getHandle().listTimers()).forEachRemaining(
            expiry -> getHandle().deleteTimer((Long) expiry));
      }
    } else if (!lookups.isEmpty() && latest.exists()) {
      record = latest.get();
    }
    for (Row row : lookups) {
      if (record != null) {
        out.add(complete(row, record, now));
        continue;
      }
      long firstSeen = row.isNullAt(columns.firstSeen) ? now : row.getLong(columns.firstSeen);
      if (maxWaitMs > 0 && now - firstSeen < maxWaitMs) {
        waiting.appendValue(withFirstSeen(row, firstSeen));
        getHandle().registerTimer(firstSeen + maxWaitMs);
      } else {
        out.add(complete(row, null, now));
      }
    }
    return CollectionConverters.asScala(out.iterator());
  }

  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(Long key, TimerValues timerValues,
                                                           ExpiredTimerInfo expiredTimerInfo) {
    long now = timerValues.getCurrentProcessingTimeInMs();
    List<Row> out = new ArrayList<>();
    List<Row> kept = new ArrayList<>();
    if (waiting.exists()) {
      CollectionConverters.asJava(waiting.get()).forEachRemaining(row -> {
        if (row.getLong(columns.firstSeen) + maxWaitMs <= now) {
          out.add(complete(row, null, now));
        } else {
          kept.add(row);
        }
      });
    }
    if (!out.isEmpty()) {
      if (kept.isEmpty()) {
        waiting.clear();
      } else {
        waiting.put(kept.toArray(new Row[0]));
      }
    }
    return CollectionConverters.asScala(out.iterator());
  }

  /** Apply a key's changes of one batch in read order; the record they leave (null if deleted). */
  private Row applyChanges(List<Row> changes) {
    changes.sort(readOrder());
    Row last = changes.get(changes.size() - 1);
    if (DELETE.equals(last.getString(columns.role))) {
      latest.clear();
      return null;
    }
    Object[] values = new Object[columns.state.length];
    for (int i = 0; i < values.length; i++) {
      values[i] = last.get(columns.state[i]);
    }
    Row record = new GenericRowWithSchema(values, columns.stateSchema);
    latest.update(record);
    return record;
  }

  private Comparator<Row> readOrder() {
    return (a, b) -> {
      for (int i : columns.order) {
        int c = Long.compare(a.isNullAt(i) ? Long.MIN_VALUE : ((Number) a.get(i)).longValue(),
            b.isNullAt(i) ? Long.MIN_VALUE : ((Number) b.get(i)).longValue());
        if (c != 0) {
          return c;
        }
      }
      return 0;
    };
  }

  /** The row decided: the record's state columns (nulls when missing), found, firstSeen and waited. */
  private Row complete(Row row, Row record, long now) {
    Object[] values = values(row);
    long firstSeen = row.isNullAt(columns.firstSeen) ? now : row.getLong(columns.firstSeen);
    for (int i = 0; i < columns.state.length; i++) {
      values[columns.state[i]] = record == null ? null : record.get(i);
    }
    values[columns.found] = record == null ? MISSING : FOUND;
    values[columns.firstSeen] = firstSeen;
    values[columns.waited] = now - firstSeen;
    return new GenericRowWithSchema(values, columns.schema);
  }

  private Row withFirstSeen(Row row, long firstSeen) {
    Object[] values = values(row);
    values[columns.firstSeen] = firstSeen;
    return new GenericRowWithSchema(values, columns.schema);
  }

  private static Object[] values(Row row) {
    Object[] values = new Object[row.length()];
    for (int i = 0; i < values.length; i++) {
      values[i] = row.get(i);
    }
    return values;
  }
}
