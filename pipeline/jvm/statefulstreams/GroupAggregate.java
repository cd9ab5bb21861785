package statefulstreams;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

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
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A grouped aggregation over an upsert table that retracts: COUNT, SUM, MIN and MAX per group,
 * kept right when a row changes group or is deleted.
 *
 * <p>Its input is {@link UpsertJoin}'s output with {@code emitBefore}: per changed row, a
 * {@code before} row (its old contribution, to retract) and/or an {@code after} row (its new
 * one), keyed here by the group-key column (the group's values, encoded by Python). The member
 * column holds the row's primary key.
 *
 * <p>State per group, in the RocksDB state store: {@code members} (MapState from each member's
 * primary key to its aggregated input columns) and {@code emitted} (ValueState, the last result
 * row sent downstream).
 *
 * <p>Call order and guarantees (Spark calls {@code handleInputRows} once per group with input in
 * a batch; there are no timers):
 * <ol>
 *   <li>Every {@code before} row of the batch is removed from the members, then every
 *       {@code after} row is put in (UpsertJoin emits at most one of each per member and batch).</li>
 *   <li>The aggregates are computed from the members. A result that differs from the last one
 *       emitted is emitted with op {@code upsert}; a group left without members, which had a
 *       result, emits op {@code delete}; an unchanged result emits nothing.</li>
 *   <li>A row with any other op (a dead letter) is passed through, its aggregate columns null.</li>
 * </ol>
 * Output columns: the input's, then one column per aggregate; a result row has the group columns,
 * the op column and the aggregates set, the others null. COUNT is
 * a long (COUNT of a column counts its non-null values; an empty input column means COUNT(*)),
 * SUM a long over whole numbers and a double otherwise, MIN and MAX keep their input's type;
 * over no non-null value SUM, MIN and MAX are null, as in SQL.
 */
public final class GroupAggregate extends StatefulProcessor<String, Row, Row> {
  private static final long serialVersionUID = 1L;

  static final String BEFORE = "before", AFTER = "after", UPSERT = "upsert", DELETE = "delete";

  /** Column positions and the aggregates' specification. */
  static final class Spec implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final int groupKey, member, op;
    final int width; // the input's columns; the aggregates follow
    final int[] groups;
    final String[] functions;
    final int[] inputs; // -1 for COUNT(*)
    final int[] memberInputs; // an aggregate's position in the member row (-1 for COUNT(*))
    final StructType memberSchema, outputSchema;

    Spec(StructType schema, String groupKey, String member, String op, String[] groups, String[] aggregates) {
      this.groupKey = schema.fieldIndex(groupKey);
      this.member = schema.fieldIndex(member);
      this.op = schema.fieldIndex(op);
      this.groups = Arrays.stream(groups).mapToInt(schema::fieldIndex).toArray();
      int n = aggregates.length;
      functions = new String[n];
      inputs = new int[n];
      memberInputs = new int[n];
      List<StructField> memberFields = new ArrayList<>();
      List<StructField> outFields = new ArrayList<>(Arrays.asList(schema.fields()));
      width = schema.length();
      for (int a = 0; a < n; a++) {
        String[] parts = aggregates[a].split(":", -1); // function:input:output
        functions[a] = parts[0].toUpperCase();
        inputs[a] = parts[1].isEmpty() ? -1 : schema.fieldIndex(parts[1]);
        DataType type = inputs[a] < 0 ? DataTypes.LongType : schema.fields()[inputs[a]].dataType();
        if (inputs[a] >= 0) {
          memberInputs[a] = memberFields.size();
          memberFields.add(new StructField("in" + a, type, true, org.apache.spark.sql.types.Metadata.empty()));
        } else {
          memberInputs[a] = -1;
        }
        DataType outType;  // of the aggregate's output column
        switch (functions[a]) {
          case "COUNT":
            outType = DataTypes.LongType;
            break;
          case "SUM":
            outType = isWhole(type) ? DataTypes.LongType : DataTypes.DoubleType;
            break;
          case "MIN":
          case "MAX":
            outType = type;
            break;
          default:
            throw new IllegalArgumentException("unsupported aggregate " + parts[0] + "; supported: COUNT, SUM, MIN, MAX");
        }
        outFields.add(new StructField(parts[2], outType, true, org.apache.spark.sql.types.Metadata.empty()));
      }
      // A member row must not be empty for the state encoder: COUNT(*) alone keeps a marker.
      if (memberFields.isEmpty()) {
        memberFields.add(new StructField("present", DataTypes.BooleanType, true,
            org.apache.spark.sql.types.Metadata.empty()));
      }
      memberSchema = new StructType(memberFields.toArray(new StructField[0]));
      outputSchema = new StructType(outFields.toArray(new StructField[0]));
    }

    static boolean isWhole(DataType type) {
      return type.equals(DataTypes.LongType) || type.equals(DataTypes.IntegerType)
          || type.equals(DataTypes.ShortType) || type.equals(DataTypes.ByteType);
    }
  }

  private final Spec spec;
  private transient MapState<String, Row> members;
  private transient ValueState<Row> emitted;

  public GroupAggregate(Spec spec) {
    this.spec = spec;
  }

  /**
   * The aggregation as a streaming Dataset, grouped by the (string) group-key column, append mode.
   * Called on the driver, from Python through py4j: {@code groups} is comma-separated, and
   * {@code aggregates} is a comma-separated list of {@code FUNCTION:input:output}.
   */
  public static Dataset<Row> apply(Dataset<Row> input, String groupKey, String member, String op, String groups,
                                   String aggregates) {
    Spec spec = new Spec(input.schema(), groupKey, member, op, groups.split(","), aggregates.split(","));
    return KeyedByColumn.group(input, groupKey, Encoders.STRING(), "")
        .transformWithState(new GroupAggregate(spec), TimeMode.None(), OutputMode.Append(),
            Encoders.row(spec.outputSchema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    members = getHandle().getMapState("members", Encoders.STRING(), Encoders.row(spec.memberSchema),
        TTLConfig.NONE());
    emitted = getHandle().getValueState("emitted", Encoders.row(spec.outputSchema), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(String key, scala.collection.Iterator<Row> rows,
                                                        TimerValues timerValues) {
    List<Row> added = new ArrayList<>();
    List<Row> out = new ArrayList<>();
    Row sample = null;
    while (rows.hasNext()) {
      Row row = rows.next();
      String op = row.isNullAt(spec.op) ? "" : row.getString(spec.op);
      if (BEFORE.equals(op) || DELETE.equals(op)) {
        members.removeKey(row.getString(spec.member));
        sample = row;
      } else if (AFTER.equals(op)) {
        added.add(row);
        sample = row;
      } else {
        Object[] values = java.util.Arrays.copyOf(values(row), spec.outputSchema.length());
        out.add(new GenericRowWithSchema(values, spec.outputSchema));
      }
    }
    if (sample == null) {
      return CollectionConverters.asScala(out.iterator());
    }
    for (Row row : added) {
      members.updateValue(row.getString(spec.member), memberRow(row));
    }
    Row last = emitted.exists() ? emitted.get() : null;
    if (!members.exists() || !members.iterator().hasNext()) {
      if (last != null) {
        Object[] values = values(last);
        values[spec.op] = DELETE;
        out.add(new GenericRowWithSchema(values, spec.outputSchema));
        emitted.clear();
      }
    } else {
      Row result = compute(sample);
      if (last == null || !result.equals(last)) {
        emitted.update(result);
        out.add(result);
      }
    }
    return CollectionConverters.asScala(out.iterator());
  }

  private Row memberRow(Row row) {
    List<Object> values = new ArrayList<>();
    for (int a = 0; a < spec.inputs.length; a++) {
      if (spec.inputs[a] >= 0) {
        values.add(row.get(spec.inputs[a]));
      }
    }
    if (values.isEmpty()) {
      values.add(Boolean.TRUE);
    }
    return new GenericRowWithSchema(values.toArray(), spec.memberSchema);
  }

  /** The group's result row (op {@code upsert}) from its members; group values from {@code sample}. */
  @SuppressWarnings({"unchecked", "rawtypes"})
  private Row compute(Row sample) {
    int n = spec.functions.length;
    long[] counts = new long[n];
    long[] longSums = new long[n];
    double[] doubleSums = new double[n];
    Object[] extremes = new Object[n];
    scala.collection.Iterator<Tuple2<String, Row>> it = members.iterator();
    while (it.hasNext()) {
      Row member = it.next()._2();
      for (int a = 0; a < n; a++) {
        Object value = spec.memberInputs[a] < 0 ? Boolean.TRUE : member.get(spec.memberInputs[a]);
        if (value == null) {
          continue;
        }
        counts[a]++;
        switch (spec.functions[a]) {
          case "SUM":
            if (value instanceof Double || value instanceof Float || value instanceof java.math.BigDecimal) {
              doubleSums[a] += ((Number) value).doubleValue();
            } else {
              longSums[a] += ((Number) value).longValue();
            }
            break;
          case "MIN":
            if (extremes[a] == null || ((Comparable) value).compareTo(extremes[a]) < 0) {
              extremes[a] = value;
            }
            break;
          case "MAX":
            if (extremes[a] == null || ((Comparable) value).compareTo(extremes[a]) > 0) {
              extremes[a] = value;
            }
            break;
          default:
            break;
        }
      }
    }
    int base = spec.width;
    Object[] values = new Object[base + n];
    for (int g : spec.groups) {
      values[g] = sample.get(g);
    }
    for (int a = 0; a < n; a++) {
      Object result;
      switch (spec.functions[a]) {
        case "COUNT":
          result = counts[a];
          break;
        case "SUM":
          boolean whole = spec.outputSchema.fields()[base + a].dataType().equals(DataTypes.LongType);
          result = counts[a] == 0 ? null : whole ? (Object) longSums[a] : (Object) (doubleSums[a] + longSums[a]);
          break;
        default:
          result = extremes[a];
      }
      values[base + a] = result;
    }
    values[spec.op] = UPSERT;
    return new GenericRowWithSchema(values, spec.outputSchema);
  }

  private static Object[] values(Row row) {
    Object[] values = new Object[row.length()];
    for (int i = 0; i < values.length; i++) {
      values[i] = row.get(i);
    }
    return values;
  }
}
