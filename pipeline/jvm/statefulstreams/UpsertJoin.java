package statefulstreams;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
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
 * Upsert tables over changelog topics, left-joined on one key: keeps the latest row of every
 * side per key and emits the joined row whenever a side changes.
 *
 * <p>It knows nothing of the tables. Python (pipeline/sql/) describes the sides with column
 * names ({@link JoinSpec}). Every input row is one change of one side: the side column holds the
 * side's index (0 is the driving, left-most table), the op column ({@link ChangeOp}) holds
 * {@code upsert} or {@code delete} (an empty payload), and the side's value columns hold the new
 * row (other sides' columns are null).
 *
 * <p>State per key, in the RocksDB state store: one ValueState per side ({@code side0},
 * {@code side1}, …) with that side's value columns. With {@link JoinSpec#stateTtlMs} above 0
 * (Flink's {@code table.exec.state.ttl}), each side's ValueState has Spark's TTL in processing
 * time: a side's row not written for the TTL reads as missing and Spark's state store drops it,
 * each side on its own, with nothing emitted (Flink's regular join: each input side's state
 * expires the TTL after it was last written). With 0, TimeMode.None and no TTL, as before.
 *
 * <p>Call order and guarantees (Spark calls {@code handleInputRows} once per key with input in a
 * batch; there are no timers):
 * <ol>
 *   <li>A batch's changes for a key apply in read order (the order columns), so the last change
 *       of each side wins.</li>
 *   <li>If any side changed, the key's joined rows are emitted, all with the input schema and the
 *       op column set to: {@code before} (only when {@code emitBefore}: the joined row as it was
 *       before the batch, when the driving side was there), {@code after} (the joined row now,
 *       when the driving side is there, with nulls for the missing sides) or {@code delete} (the
 *       driving side was there before the batch and is gone now).</li>
 *   <li>A key whose driving side is missing before and after the batch emits nothing; its other
 *       sides are still kept, ready for the driving row.</li>
 *   <li>An {@code expire} row (HAVING's join over {@link GroupAggregate}, whose group a TTL
 *       dropped) drops the key's rows as they were before the batch, with nothing emitted for
 *       them: the batch's other changes apply to an empty key, so no {@code before} row is sent.</li>
 *   <li>A row with any other op (a dead letter) is passed through unchanged and changes nothing.</li>
 * </ol>
 * A grouped aggregation reads {@code before} as the retraction of a row's old contribution and
 * {@code after} as its new one; a join's output is the {@code after} and {@code delete} rows.
 */
public final class UpsertJoin extends StatefulProcessor<String, Row, Row> {
  private static final long serialVersionUID = 1L;

  /** A {@link JoinSpec}'s columns found in the row schema (shared by input and output rows). */
  static final class Columns implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final StructType schema;
    final Field key, side, op;
    final Field[][] values;  // per side
    final StructType[] sideSchemas;
    final Field[] order;

    Columns(StructType schema, JoinSpec spec) {
      this.schema = schema;
      this.key = new Field(schema, spec.key);
      this.side = new Field(schema, spec.side);
      this.op = new Field(schema, spec.op);
      this.values = spec.sides.stream().map(columns -> Field.all(schema, columns)).toArray(Field[][]::new);
      this.sideSchemas = new StructType[values.length];
      for (int s = 0; s < values.length; s++) {
        this.sideSchemas[s] = Rows.schemaOf(schema, values[s]);
      }
      this.order = Field.all(schema, spec.readOrder);
    }
  }

  private final Columns columns;
  private final boolean emitBefore;
  private final long stateTtlMs;
  private transient List<ValueState<Row>> sides;

  UpsertJoin(Columns columns, boolean emitBefore, long stateTtlMs) {
    this.columns = columns;
    this.emitBefore = emitBefore;
    this.stateTtlMs = stateTtlMs;
  }

  /**
   * The operator as a streaming Dataset: {@code input} grouped by the (string) key column and run
   * through {@code transformWithState}, append mode; the output has the input's schema. Called on
   * the driver, from Python through py4j.
   */
  public static Dataset<Row> apply(Dataset<Row> input, JoinSpec spec) {
    Columns columns = new Columns(input.schema(), spec);
    return KeyedByColumn.group(input, spec.key, Encoders.STRING(), "")
        .transformWithState(new UpsertJoin(columns, spec.emitBefore, spec.stateTtlMs),
            spec.stateTtlMs > 0 ? TimeMode.ProcessingTime() : TimeMode.None(), OutputMode.Append(),
            Encoders.row(columns.schema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    sides = new ArrayList<>();
    TTLConfig ttl = stateTtlMs > 0 ? TTLConfig.apply(Duration.ofMillis(stateTtlMs)) : TTLConfig.NONE();
    for (int s = 0; s < columns.sideSchemas.length; s++) {
      sides.add(getHandle().getValueState("side" + s, Encoders.row(columns.sideSchemas[s]), ttl));
    }
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(String key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    Rows.Split split = Rows.split(rows, row -> isChange(opOf(row)) ? Rows.Part.CHANGE : Rows.Part.PASS);
    List<Row> changes = split.changes;
    List<Row> out = split.passed;
    if (changes.isEmpty()) {
      return CollectionConverters.asScala(out.iterator());
    }
    changes.sort(Rows.readOrder(columns.order));
    int count = sides.size();
    Row[] before = new Row[count];
    Row[] after = new Row[count];
    for (int s = 0; s < count; s++) {
      before[s] = sides.get(s).exists() ? sides.get(s).get() : null;
      after[s] = before[s];
    }
    boolean[] touched = new boolean[count];
    if (changes.stream().anyMatch(change -> opOf(change) == ChangeOp.EXPIRE)) {
      Arrays.fill(before, null);
      Arrays.fill(after, null);
      Arrays.fill(touched, true);
      changes.removeIf(change -> opOf(change) == ChangeOp.EXPIRE);
    }
    for (Row change : changes) {
      int s = ((Number) columns.side.get(change)).intValue();
      touched[s] = true;
      after[s] = opOf(change) == ChangeOp.DELETE ? null : Rows.project(change, columns.values[s],
          columns.sideSchemas[s]);
    }
    for (int s = 0; s < count; s++) {
      if (!touched[s]) {
        continue;
      }
      if (after[s] == null) {
        sides.get(s).clear();
      } else {
        sides.get(s).update(after[s]);
      }
    }
    if (before[0] != null && emitBefore) {
      out.add(joined(key, before, ChangeOp.BEFORE));
    }
    if (after[0] != null) {
      out.add(joined(key, after, ChangeOp.AFTER));
    } else if (before[0] != null) {
      out.add(joined(key, new Row[count], ChangeOp.DELETE));
    }
    return CollectionConverters.asScala(out.iterator());
  }

  private ChangeOp opOf(Row row) {
    return ChangeOp.of(columns.op.getString(row));
  }

  private static boolean isChange(ChangeOp op) {
    return op == ChangeOp.UPSERT || op == ChangeOp.DELETE || op == ChangeOp.EXPIRE;
  }

  /** One output row: the key, the op, and each side's values (nulls for a missing side). */
  private Row joined(String key, Row[] sideRows, ChangeOp op) {
    Object[] values = new Object[columns.schema.length()];
    columns.key.set(values, key);
    columns.op.set(values, op.value);
    for (int s = 0; s < sideRows.length; s++) {
      if (sideRows[s] == null) {
        continue;
      }
      for (int i = 0; i < columns.values[s].length; i++) {
        columns.values[s][i].set(values, sideRows[s].get(i));
      }
    }
    return new GenericRowWithSchema(values, columns.schema);
  }
}
