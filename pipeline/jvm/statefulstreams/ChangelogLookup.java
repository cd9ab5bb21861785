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

/**
 * A keyed lookup over a changelog: keeps the latest record per key and attaches it to the rows
 * that ask for it, making them wait (up to a bound) for a key that is not there yet.
 *
 * <p>It knows nothing of users or items. Python describes a lookup with column names
 * ({@link LookupSpec}) and uses this class once per lookup. Every input row has a role
 * ({@link LookupRole}), read from the role column:
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
 *       to {@code found} ({@link LookupOutcome}). Otherwise, while
 *       {@code now - firstSeen < maxWaitMs} it waits; after that (or at once when maxWaitMs is 0)
 *       it is emitted with null state and {@code missing}.</li>
 *   <li>Every emitted lookup row has firstSeen set (to the batch time when it was null) and
 *       waited = now - firstSeen, so a second lookup continues the same clock.</li>
 * </ol>
 * These are the decisions specified in {@code pipeline/enrich/rules.py} ({@code LookupModel}); a
 * model-based test holds this class to them. Rows are never dropped: each input row is either
 * passed through, emitted as a lookup result, or held in {@code waiting} until it is.
 */
public final class ChangelogLookup extends StatefulProcessor<Long, Row, Row> {
  private static final long serialVersionUID = 1L;

  private final LookupColumns columns;
  private final long maxWaitMs;
  private transient ValueState<Row> latest;
  private transient ListState<Row> waiting;

  ChangelogLookup(LookupColumns columns, long maxWaitMs) {
    this.columns = columns;
    this.maxWaitMs = maxWaitMs;
  }

  /**
   * The lookup as a streaming Dataset: {@code input} grouped by the key column and run through
   * {@code transformWithState} in processing time, append mode. The output has the input's schema.
   * Called on the driver, from Python through py4j.
   */
  public static Dataset<Row> apply(Dataset<Row> input, LookupSpec spec) {
    StructType schema = input.schema();
    LookupColumns columns = new LookupColumns(schema, spec);
    return KeyedByColumn.group(input, spec.key, Encoders.LONG(), 0L)
        .transformWithState(new ChangelogLookup(columns, spec.maxWaitMs), TimeMode.ProcessingTime(),
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
    Rows.Split split = Rows.split(rows, row -> columns.roleOf(row).part);
    List<Row> out = split.passed;
    Row record = null;
    if (!split.changes.isEmpty()) {
      record = applyChanges(split.changes);
      if (record != null && waiting.exists()) {
        Row arrived = record;
        CollectionConverters.asJava(waiting.get()).forEachRemaining(row -> out.add(complete(row, arrived, now)));
        waiting.clear();
        CollectionConverters.asJava(getHandle().listTimers()).forEachRemaining(
            expiry -> getHandle().deleteTimer((Long) expiry));
      }
    } else if (!split.lookups.isEmpty() && latest.exists()) {
      record = latest.get();
    }
    for (Row row : split.lookups) {
      if (record != null) {
        out.add(complete(row, record, now));
        continue;
      }
      long firstSeen = columns.firstSeen.isNull(row) ? now : columns.firstSeen.getLong(row);
      if (maxWaitMs > 0 && now - firstSeen < maxWaitMs) {
        waiting.appendValue(Rows.with(row, columns.firstSeen, firstSeen, columns.schema));
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
    for (Row row : Rows.load(waiting)) {
      if (columns.firstSeen.getLong(row) + maxWaitMs <= now) {
        out.add(complete(row, null, now));
      } else {
        kept.add(row);
      }
    }
    if (!out.isEmpty()) {
      Rows.replace(waiting, kept);
    }
    return CollectionConverters.asScala(out.iterator());
  }

  /** Apply a key's changes of one batch in read order; the record they leave (null if deleted). */
  private Row applyChanges(List<Row> changes) {
    changes.sort(Rows.readOrder(columns.order));
    Row last = changes.get(changes.size() - 1);
    if (columns.roleOf(last) == LookupRole.DELETE) {
      latest.clear();
      return null;
    }
    Row record = Rows.project(last, columns.state, columns.stateSchema);
    latest.update(record);
    return record;
  }

  /** The row decided: the record's state columns (nulls when missing), found, firstSeen and waited. */
  private Row complete(Row row, Row record, long now) {
    Object[] values = Rows.values(row);
    long firstSeen = columns.firstSeen.isNull(row) ? now : columns.firstSeen.getLong(row);
    for (int i = 0; i < columns.state.length; i++) {
      columns.state[i].set(values, record == null ? null : record.get(i));
    }
    columns.found.set(values, (record == null ? LookupOutcome.MISSING : LookupOutcome.FOUND).value);
    columns.firstSeen.set(values, firstSeen);
    columns.waited.set(values, now - firstSeen);
    return new GenericRowWithSchema(values, columns.schema);
  }
}
