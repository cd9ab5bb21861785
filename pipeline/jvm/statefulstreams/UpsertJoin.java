package statefulstreams;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
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
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

/**
 * Upsert tables over changelog topics, left-joined on one key: keeps the latest row of every
 * side per key and emits the joined row whenever a side changes.
 *
 * <p>It knows nothing of the tables. Python (pipeline/sql/) describes the sides with column
 * names. Every input row is one change of one side: the side column holds the side's index
 * (0 is the driving, left-most table), the op column holds {@code upsert} or {@code delete} (an
 * empty payload), and the side's value columns hold the new row (other sides' columns are null).
 *
 * <p>State per key, in the RocksDB state store: one ValueState per side ({@code side0},
 * {@code side1}, …) with that side's value columns.
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
 *   <li>A row with any other op (a dead letter) is passed through unchanged and changes nothing.</li>
 * </ol>
 * A grouped aggregation reads {@code before} as the retraction of a row's old contribution and
 * {@code after} as its new one; a join's output is the {@code after} and {@code delete} rows.
 */
public final class UpsertJoin extends StatefulProcessor<String, Row, Row> {
  private static final long serialVersionUID = 1L;

  static final String UPSERT = "upsert", DELETE = "delete", BEFORE = "before", AFTER = "after";

  /** Column positions of the sides in the row schema (shared by input and output rows). */
  static final class Columns implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final StructType schema;
    final int key, side, op;
    final int[][] values;
    final StructType[] sideSchemas;
    final int[] order;

    Columns(StructType schema, String key, String side, String op, String[][] values, String[] order) {
      this.schema = schema;
      this.key = schema.fieldIndex(key);
      this.side = schema.fieldIndex(side);
      this.op = schema.fieldIndex(op);
      this.values = new int[values.length][];
      this.sideSchemas = new StructType[values.length];
      for (int s = 0; s < values.length; s++) {
        this.values[s] = Arrays.stream(values[s]).mapToInt(schema::fieldIndex).toArray();
        this.sideSchemas[s] = new StructType(Arrays.stream(this.values[s]).mapToObj(i -> schema.fields()[i])
            .toArray(StructField[]::new));
      }
      this.order = Arrays.stream(order).mapToInt(schema::fieldIndex).toArray();
    }
  }

  private final Columns columns;
  private final boolean emitBefore;
  private transient List<ValueState<Row>> sides;

  public UpsertJoin(Columns columns, boolean emitBefore) {
    this.columns = columns;
    this.emitBefore = emitBefore;
  }

  /**
   * The operator as a streaming Dataset: {@code input} grouped by the (string) key column and run
   * through {@code transformWithState}, append mode; the output has the input's schema. Called on
   * the driver, from Python through py4j. {@code sides} lists each side's value columns, sides
   * separated by ';' and columns by ','; {@code order} is comma-separated.
   */
  public static Dataset<Row> apply(Dataset<Row> input, String key, String side, String op, String sides,
                                   String order, boolean emitBefore) {
    String[] parts = sides.split(";", -1);
    String[][] values = new String[parts.length][];
    for (int s = 0; s < parts.length; s++) {
      values[s] = parts[s].isEmpty() ? new String[0] : parts[s].split(",");
    }
    Columns columns = new Columns(input.schema(), key, side, op, values, order.split(","));
    return KeyedByColumn.group(input, key, Encoders.STRING(), "")
        .transformWithState(new UpsertJoin(columns, emitBefore), TimeMode.None(), OutputMode.Append(),
            Encoders.row(columns.schema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    sides = new ArrayList<>();
    for (int s = 0; s < columns.sideSchemas.length; s++) {
      sides.add(getHandle().getValueState("side" + s, Encoders.row(columns.sideSchemas[s]), TTLConfig.NONE()));
    }
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(String key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    List<Row> changes = new ArrayList<>();
    List<Row> out = new ArrayList<>();
    while (rows.hasNext()) {
      Row row = rows.next();
      String op = row.isNullAt(columns.op) ? "" : row.getString(columns.op);
      if (UPSERT.equals(op) || DELETE.equals(op)) {
        changes.add(row);
      } else {
        out.add(row);
      }
    }
    if (changes.isEmpty()) {
      return CollectionConverters.asScala(out.iterator());
    }
    changes.sort(readOrder());
    int count = sides.size();
    Row[] before = new Row[count];
    Row[] after = new Row[count];
    for (int s = 0; s < count; s++) {
      before[s] = sides.get(s).exists() ? sides.get(s).get() : null;
      after[s] = before[s];
    }
    boolean[] touched = new boolean[count];
    for (Row change : changes) {
      int s = ((Number) change.get(columns.side)).intValue();
      touched[s] = true;
      after[s] = DELETE.equals(change.getString(columns.op)) ? null : project(change, columns.values[s],
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
      out.add(joined(key, before, BEFORE));
    }
    if (after[0] != null) {
      out.add(joined(key, after, AFTER));
    } else if (before[0] != null) {
      out.add(joined(key, new Row[count], DELETE));
    }
    return CollectionConverters.asScala(out.iterator());
  }

  private static Row project(Row row, int[] indexes, StructType schema) {
    Object[] values = new Object[indexes.length];
    for (int i = 0; i < indexes.length; i++) {
      values[i] = row.get(indexes[i]);
    }
    return new GenericRowWithSchema(values, schema);
  }

  /** One output row: the key, the op, and each side's values (nulls for a missing side). */
  private Row joined(String key, Row[] sideRows, String op) {
    Object[] values = new Object[columns.schema.length()];
    values[columns.key] = key;
    values[columns.op] = op;
    for (int s = 0; s < sideRows.length; s++) {
      if (sideRows[s] == null) {
        continue;
      }
      for (int i = 0; i < columns.values[s].length; i++) {
        values[columns.values[s][i]] = sideRows[s].get(i);
      }
    }
    return new GenericRowWithSchema(values, columns.schema);
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
}
