package statefulstreams;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

import statefulstreams.Rows.Field;

/**
 * A grouped aggregation over an upsert table that retracts: COUNT, COUNT(DISTINCT), SUM, MIN and
 * MAX per group, kept right when a row changes group or is deleted.
 *
 * <p>Python describes it with column names ({@link AggregateSpec}). Its input is
 * {@link UpsertJoin}'s output with {@code emitBefore}: per changed row, a
 * {@code before} row (its old contribution, to retract) and/or an {@code after} row (its new
 * one), keyed here by the group-key column (the group's values, encoded by Python). The member
 * column holds the row's primary key.
 *
 * <p>State per group, in the RocksDB state store: {@code members} (MapState from each member's
 * primary key to its aggregated input columns) and {@code emitted} (ValueState, the last result
 * row sent downstream).
 *
 * <p>State TTL ({@link AggregateSpec#stateTtlMs} above 0, Flink's {@code table.exec.state.ttl}):
 * a group not updated for the TTL (processing time) is dropped whole, members and last result, as
 * Flink drops a group's accumulator; nothing is sent for it but one {@code expire} row (the last
 * result, op {@code expire}), which only HAVING's join reads (pipeline/sql/runner.py drops it
 * otherwise). The group's one processing-time timer, at its last update plus the TTL, is moved on
 * every update; a group whose deadline passed before its timer fired is dropped first when input
 * arrives, so the input starts from empty state. A per-entry TTL on {@code members} would expire
 * members one by one, which Flink does not. With 0: TimeMode.None, no timers, as before.
 *
 * <p>Call order and guarantees (Spark calls {@code handleInputRows} once per group with input in
 * a batch, and {@code handleExpiredTimer} once per group whose TTL timer is due):
 * <ol>
 *   <li>With a TTL, a group whose deadline passed is dropped (an {@code expire} row) before its
 *       input applies.</li>
 *   <li>Every {@code before} row of the batch is removed from the members, then every
 *       {@code after} row is put in (UpsertJoin emits at most one of each per member and batch).</li>
 *   <li>The aggregates are computed from the members. A result that differs from the last one
 *       emitted is emitted with op {@code upsert}; a group left without members, which had a
 *       result, emits op {@code delete}; an unchanged result emits nothing.</li>
 *   <li>A row with any other op (a dead letter) is passed through, its aggregate columns null.</li>
 *   <li>With a TTL, a group that changed gets its timer at now plus the TTL (the old one
 *       deleted); a group left without members has none.</li>
 * </ol>
 * Output columns: the input's, then one column per aggregate; a result row has the group columns,
 * the op column and the aggregates set, the others null. COUNT is
 * a long (COUNT of a column counts its non-null values; an empty input column means COUNT(*);
 * COUNT_DISTINCT counts its distinct non-null values),
 * SUM a long over whole numbers and a double otherwise, MIN and MAX keep their input's type;
 * over no non-null value SUM, MIN and MAX are null, as in SQL.
 */
public final class GroupAggregate extends StatefulProcessor<String, Row, Row> {
  private static final long serialVersionUID = 1L;

  /** An {@link AggregateSpec}'s columns found in the row schema, and the member and output schemas. */
  static final class Columns implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final Field groupKey, member, op;
    final Field[] groups;
    final Aggregate[] functions;
    final Field[] inputs;  // null for COUNT(*)
    final Field[] memberInputs;  // an aggregate's input in the member row (null for COUNT(*))
    final Field[] results;  // an aggregate's column in the output row
    final StructType memberSchema, outputSchema;

    Columns(StructType schema, AggregateSpec spec) {
      this.groupKey = new Field(schema, spec.groupKey);
      this.member = new Field(schema, spec.member);
      this.op = new Field(schema, spec.op);
      this.groups = Field.all(schema, spec.groups);
      int n = spec.functions.size();
      functions = spec.functions.toArray(new Aggregate[0]);
      inputs = new Field[n];
      List<StructField> memberFields = new ArrayList<>();
      List<StructField> outFields = new ArrayList<>(Arrays.asList(schema.fields()));
      for (int a = 0; a < n; a++) {
        String input = spec.inputs.get(a);
        inputs[a] = input == null || input.isEmpty() ? null : new Field(schema, input);
        DataType type = inputs[a] == null ? DataTypes.LongType : schema.fields()[inputs[a].index].dataType();
        if (inputs[a] != null) {
          memberFields.add(new StructField("in" + a, type, true, Metadata.empty()));
        }
        outFields.add(new StructField(spec.outputs.get(a), functions[a].resultType(type), true, Metadata.empty()));
      }
      // A member row must not be empty for the state encoder: COUNT(*) alone keeps a marker.
      if (memberFields.isEmpty()) {
        memberFields.add(new StructField("present", DataTypes.BooleanType, true, Metadata.empty()));
      }
      memberSchema = new StructType(memberFields.toArray(new StructField[0]));
      outputSchema = new StructType(outFields.toArray(new StructField[0]));
      memberInputs = new Field[n];
      results = new Field[n];
      for (int a = 0; a < n; a++) {
        memberInputs[a] = inputs[a] == null ? null : new Field(memberSchema, "in" + a);
        results[a] = new Field(outputSchema, spec.outputs.get(a));
      }
    }
  }

  private final Columns columns;
  private final long stateTtlMs;
  private transient MapState<String, Row> members;
  private transient ValueState<Row> emitted;

  GroupAggregate(Columns columns, long stateTtlMs) {
    this.columns = columns;
    this.stateTtlMs = stateTtlMs;
  }

  /**
   * The aggregation as a streaming Dataset, grouped by the (string) group-key column, append mode.
   * Called on the driver, from Python through py4j.
   */
  public static Dataset<Row> apply(Dataset<Row> input, AggregateSpec spec) {
    Columns columns = new Columns(input.schema(), spec);
    return KeyedByColumn.group(input, spec.groupKey, Encoders.STRING(), "")
        .transformWithState(new GroupAggregate(columns, spec.stateTtlMs),
            spec.stateTtlMs > 0 ? TimeMode.ProcessingTime() : TimeMode.None(), OutputMode.Append(),
            Encoders.row(columns.outputSchema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    members = getHandle().getMapState("members", Encoders.STRING(), Encoders.row(columns.memberSchema),
        TTLConfig.NONE());
    emitted = getHandle().getValueState("emitted", Encoders.row(columns.outputSchema), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(String key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    List<Row> added = new ArrayList<>();
    List<Row> out = new ArrayList<>();
    long deadline = stateTtlMs > 0 ? currentDeadline() : -1;
    if (deadline >= 0 && deadline <= timerValues.getCurrentProcessingTimeInMs()) {
      // due, its timer not fired yet: the group is gone before this batch's input applies
      getHandle().deleteTimer(deadline);
      deadline = -1;
      expire(out);
    }
    Row sample = null;
    while (rows.hasNext()) {
      Row row = rows.next();
      ChangeOp op = ChangeOp.of(columns.op.getString(row));
      if (op == ChangeOp.BEFORE || op == ChangeOp.DELETE) {
        members.removeKey(columns.member.getString(row));
        sample = row;
      } else if (op == ChangeOp.AFTER) {
        added.add(row);
        sample = row;
      } else {
        Object[] values = Arrays.copyOf(Rows.values(row), columns.outputSchema.length());
        out.add(new GenericRowWithSchema(values, columns.outputSchema));
      }
    }
    if (sample == null) {
      return CollectionConverters.asScala(out.iterator());
    }
    for (Row row : added) {
      members.updateValue(columns.member.getString(row), memberRow(row));
    }
    Row last = emitted.exists() ? emitted.get() : null;
    boolean empty = !members.exists() || !members.iterator().hasNext();
    if (empty) {
      if (last != null) {
        out.add(Rows.with(last, columns.op, ChangeOp.DELETE.value, columns.outputSchema));
        emitted.clear();
      }
    } else {
      Row result = compute(sample);
      if (last == null || !result.equals(last)) {
        emitted.update(result);
        out.add(result);
      }
    }
    if (stateTtlMs > 0) {
      // OnCreateAndWrite: every update moves the group's one deadline to now plus the TTL
      if (deadline >= 0) {
        getHandle().deleteTimer(deadline);
      }
      if (!empty) {
        getHandle().registerTimer(timerValues.getCurrentProcessingTimeInMs() + stateTtlMs);
      }
    }
    return CollectionConverters.asScala(out.iterator());
  }

  /** The group's TTL ran out: its state dropped, nothing sent but the {@code expire} row. */
  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(String key, TimerValues timerValues,
                                                           ExpiredTimerInfo expiredTimerInfo) {
    List<Row> out = new ArrayList<>();
    expire(out);
    return CollectionConverters.asScala(out.iterator());
  }

  /** The group's registered deadline (it has at most one), or -1. */
  private long currentDeadline() {
    scala.collection.Iterator<Object> timers = getHandle().listTimers();
    long deadline = -1;
    while (timers.hasNext()) {
      deadline = Math.max(deadline, ((Number) timers.next()).longValue());
    }
    return deadline;
  }

  /** Drops the group's members and last result; adds that result as op {@code expire} to {@code out}. */
  private void expire(List<Row> out) {
    if (emitted.exists()) {
      out.add(Rows.with(emitted.get(), columns.op, ChangeOp.EXPIRE.value, columns.outputSchema));
    }
    members.clear();
    emitted.clear();
  }

  private Row memberRow(Row row) {
    List<Object> values = new ArrayList<>();
    for (Field input : columns.inputs) {
      if (input != null) {
        values.add(input.get(row));
      }
    }
    if (values.isEmpty()) {
      values.add(Boolean.TRUE);
    }
    return new GenericRowWithSchema(values.toArray(), columns.memberSchema);
  }

  /** The group's result row (op {@code upsert}) from its members; group values from {@code sample}. */
  @SuppressWarnings({"unchecked", "rawtypes"})
  private Row compute(Row sample) {
    int n = columns.functions.length;
    long[] counts = new long[n];
    long[] longSums = new long[n];
    double[] doubleSums = new double[n];
    Object[] extremes = new Object[n];
    List<Set<Object>> distinct = new ArrayList<>(n);
    for (int a = 0; a < n; a++) {
      distinct.add(columns.functions[a] == Aggregate.COUNT_DISTINCT ? new HashSet<>() : null);
    }
    scala.collection.Iterator<Tuple2<String, Row>> it = members.iterator();
    while (it.hasNext()) {
      Row member = it.next()._2();
      for (int a = 0; a < n; a++) {
        Object value = columns.memberInputs[a] == null ? Boolean.TRUE : columns.memberInputs[a].get(member);
        if (value == null) {
          continue;
        }
        counts[a]++;
        switch (columns.functions[a]) {
          case COUNT_DISTINCT:
            distinct.get(a).add(value);
            break;
          case SUM:
            if (value instanceof Double || value instanceof Float || value instanceof java.math.BigDecimal) {
              doubleSums[a] += ((Number) value).doubleValue();
            } else {
              longSums[a] += ((Number) value).longValue();
            }
            break;
          case MIN:
            if (extremes[a] == null || ((Comparable) value).compareTo(extremes[a]) < 0) {
              extremes[a] = value;
            }
            break;
          case MAX:
            if (extremes[a] == null || ((Comparable) value).compareTo(extremes[a]) > 0) {
              extremes[a] = value;
            }
            break;
          default:
            break;
        }
      }
    }
    Object[] values = new Object[columns.outputSchema.length()];
    for (Field group : columns.groups) {
      group.set(values, group.get(sample));
    }
    for (int a = 0; a < n; a++) {
      Object result;
      switch (columns.functions[a]) {
        case COUNT:
          result = counts[a];
          break;
        case COUNT_DISTINCT:
          result = (long) distinct.get(a).size();
          break;
        case SUM:
          boolean whole = columns.outputSchema.fields()[columns.results[a].index].dataType().equals(DataTypes.LongType);
          result = counts[a] == 0 ? null : whole ? (Object) longSums[a] : (Object) (doubleSums[a] + longSums[a]);
          break;
        default:
          result = extremes[a];
      }
      columns.results[a].set(values, result);
    }
    columns.op.set(values, ChangeOp.UPSERT.value);
    return new GenericRowWithSchema(values, columns.outputSchema);
  }
}
