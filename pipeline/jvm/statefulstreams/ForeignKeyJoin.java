package statefulstreams;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

import statefulstreams.Rows.Field;

/**
 * A foreign-key join of upsert tables: the driving table's rows joined, on one of their columns,
 * to the referenced table's row with that primary key, keyed here by the foreign key value.
 *
 * <p>Python describes it with column names ({@link ForeignKeySpec}) and feeds it two kinds of
 * rows, keyed by the foreign-key column (pipeline/sql/foreign_key.py):
 * <ul>
 *   <li>a driving row's versions from {@link UpsertJoin} with {@code emitBefore}: {@code before}
 *       (its version before the batch, under its old foreign key) and {@code after} (its version
 *       now, under its new one), the key column holding its primary key;</li>
 *   <li>the referenced table's changes, {@code upsert} or {@code delete}, under its own key.</li>
 * </ul>
 *
 * <p>State per foreign key value, in the RocksDB state store: {@code referencing} (MapState from
 * each driving row's primary key to its value columns) and {@code referenced} (ValueState, the
 * referenced row). With {@link ForeignKeySpec#stateTtlMs} above 0 (Flink's
 * {@code table.exec.state.ttl}), both have Spark's TTL in processing time, as {@link UpsertJoin}'s
 * sides: each {@code referencing} entry expires the TTL after that driving row was last put in
 * (its {@code after}), the referenced row the TTL after it was last written, each on its own and
 * with nothing emitted (Flink's regular join: each input side's state expires the TTL after it was
 * last written). An expired entry is as if never held: a referenced row's change no longer
 * updates it and its {@code before} finds nothing to retract; an expired referenced row reads as
 * missing. With 0, TimeMode.None and no TTL.
 *
 * <p>In an N-way chain (pipeline/sql/foreign_key.py) one ForeignKeyJoin's output is the next
 * one's driving rows: its {@code before} and {@code after} are what it sent, so the next one holds
 * exactly the rows sent and retracts each with the row it was sent with.
 *
 * <p>Call order and guarantees (Spark calls {@code handleInputRows} once per foreign key value
 * with input in a batch; there are no timers):
 * <ol>
 *   <li>The referenced row's changes apply in read order (the order columns): the last wins.</li>
 *   <li>Every {@code before} row's driving key is removed from {@code referencing}, then every
 *       {@code after} row is put in (UpsertJoin emits at most one of each per key and batch).</li>
 *   <li>The driving keys decided are those with a {@code before} or {@code after} row, and, when
 *       the referenced row changed, every key held before or after. Each gets the joined row now,
 *       op {@code after}, when it is held and (LEFT) always or (INNER) the referenced row is
 *       there, its columns null when it is not; and before it, op {@code before}, the joined row
 *       as it was before the batch, when that row was sent: the key was held before the batch
 *       and (LEFT) always or (INNER) the referenced row was there before the batch.</li>
 *   <li>A row with any other op (a dead letter) is passed through unchanged and changes nothing.</li>
 * </ol>
 * So each driving key gets at most one {@code before} and one {@code after} per batch, as from
 * {@link UpsertJoin} with {@code emitBefore}: a driving row that moves to another foreign key
 * value gets its {@code before} from the old value and its {@code after} from the new one. A
 * join's reader sends the {@code after}, or a delete for a {@code before} alone; a
 * {@link GroupAggregate} retracts the {@code before} from its group and adds the {@code after}.
 */
public final class ForeignKeyJoin extends StatefulProcessor<String, Row, Row> {
  private static final long serialVersionUID = 1L;

  /** A {@link ForeignKeySpec}'s columns found in the row schema (shared by input and output rows). */
  static final class Columns implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final StructType schema, drivingSchema, referencedSchema;
    final Field key, op;
    final Field[] driving, referenced, order;

    Columns(StructType schema, ForeignKeySpec spec) {
      this.schema = schema;
      this.key = new Field(schema, spec.key);
      this.op = new Field(schema, spec.op);
      this.driving = Field.all(schema, spec.driving);
      this.referenced = Field.all(schema, spec.referenced);
      this.order = Field.all(schema, spec.readOrder);
      this.drivingSchema = Rows.schemaOf(schema, driving);
      this.referencedSchema = Rows.schemaOf(schema, referenced);
    }
  }

  private final Columns columns;
  private final boolean inner;
  private final long stateTtlMs;
  private transient MapState<String, Row> referencing;
  private transient ValueState<Row> referencedRow;

  ForeignKeyJoin(Columns columns, boolean inner, long stateTtlMs) {
    this.columns = columns;
    this.inner = inner;
    this.stateTtlMs = stateTtlMs;
  }

  /**
   * The join as a streaming Dataset: {@code input} grouped by the (string) foreign-key column and
   * run through {@code transformWithState}, append mode; the output has the input's schema.
   * Called on the driver, from Python through py4j.
   */
  public static Dataset<Row> apply(Dataset<Row> input, ForeignKeySpec spec) {
    Columns columns = new Columns(input.schema(), spec);
    return KeyedByColumn.group(input, spec.foreignKey, Encoders.STRING(), "")
        .transformWithState(new ForeignKeyJoin(columns, spec.inner, spec.stateTtlMs),
            spec.stateTtlMs > 0 ? TimeMode.ProcessingTime() : TimeMode.None(), OutputMode.Append(),
            Encoders.row(columns.schema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    TTLConfig ttl = stateTtlMs > 0 ? TTLConfig.apply(Duration.ofMillis(stateTtlMs)) : TTLConfig.NONE();
    referencing = getHandle().getMapState("referencing", Encoders.STRING(), Encoders.row(columns.drivingSchema), ttl);
    referencedRow = getHandle().getValueState("referenced", Encoders.row(columns.referencedSchema), ttl);
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(String foreignKey, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    List<Row> out = new ArrayList<>();
    List<Row> leaving = new ArrayList<>();
    List<Row> arriving = new ArrayList<>();
    List<Row> references = new ArrayList<>();
    while (rows.hasNext()) {
      Row row = rows.next();
      ChangeOp op = ChangeOp.of(columns.op.getString(row));
      if (op == ChangeOp.BEFORE) {
        leaving.add(row);
      } else if (op == ChangeOp.AFTER) {
        arriving.add(row);
      } else if (op == ChangeOp.UPSERT || op == ChangeOp.DELETE) {
        references.add(row);
      } else {
        out.add(row);
      }
    }
    if (leaving.isEmpty() && arriving.isEmpty() && references.isEmpty()) {
      return CollectionConverters.asScala(out.iterator());
    }
    Row before = referencedRow.exists() ? referencedRow.get() : null;
    Row after = before;
    references.sort(Rows.readOrder(columns.order));
    for (Row change : references) {
      boolean deleted = ChangeOp.of(columns.op.getString(change)) == ChangeOp.DELETE;
      after = deleted ? null : Rows.project(change, columns.referenced, columns.referencedSchema);
    }
    if (!references.isEmpty()) {
      if (after == null) {
        referencedRow.clear();
      } else {
        referencedRow.update(after);
      }
    }
    // each driving key decided, and its row held before the batch (null: none)
    Map<String, Row> held = new LinkedHashMap<>();
    if (!references.isEmpty() && referencing.exists()) {
      scala.collection.Iterator<Tuple2<String, Row>> all = referencing.iterator();
      while (all.hasNext()) {
        Tuple2<String, Row> entry = all.next();
        held.put(entry._1(), entry._2());
      }
    }
    for (List<Row> changes : List.of(leaving, arriving)) {
      for (Row change : changes) {
        String key = columns.key.getString(change);
        if (!held.containsKey(key)) {
          held.put(key, referencing.containsKey(key) ? referencing.getValue(key) : null);
        }
      }
    }
    for (Row change : leaving) {
      referencing.removeKey(columns.key.getString(change));
    }
    for (Row change : arriving) {
      referencing.updateValue(columns.key.getString(change),
          Rows.project(change, columns.driving, columns.drivingSchema));
    }
    boolean sentBefore = !inner || before != null;
    boolean sendNow = !inner || after != null;
    for (Map.Entry<String, Row> entry : held.entrySet()) {
      String key = entry.getKey();
      if (entry.getValue() != null && sentBefore) {
        out.add(joined(key, entry.getValue(), before, ChangeOp.BEFORE));
      }
      if (sendNow && referencing.containsKey(key)) {
        out.add(joined(key, referencing.getValue(key), after, ChangeOp.AFTER));
      }
    }
    return CollectionConverters.asScala(out.iterator());
  }

  /** One output row: the driving key, the op, and the two rows' values (nulls for a missing one). */
  private Row joined(String key, Row drivingRow, Row referenced, ChangeOp op) {
    Object[] values = new Object[columns.schema.length()];
    columns.key.set(values, key);
    columns.op.set(values, op.value);
    if (drivingRow != null) {
      for (int i = 0; i < columns.driving.length; i++) {
        columns.driving[i].set(values, drivingRow.get(i));
      }
    }
    if (referenced != null) {
      for (int i = 0; i < columns.referenced.length; i++) {
        columns.referenced[i].set(values, referenced.get(i));
      }
    }
    return new GenericRowWithSchema(values, columns.schema);
  }
}
