package statefulstreams;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.function.Function;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.streaming.ListState;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

/**
 * What the operators of this package share about rows: columns read by name, the read order,
 * copies of a row's values, the split of a key's rows by role, and a list state replaced in one
 * call. Stateless; every method may be called on the driver or the executors.
 */
final class Rows {
  private Rows() {
  }

  /**
   * One column of a schema, found by its name once (when the operator is built, on the driver)
   * and read at its position after, so the per-row code names the columns it reads.
   */
  static final class Field implements Serializable {
    private static final long serialVersionUID = 1L;
    final String name;
    final int index;

    Field(StructType schema, String name) {
      this.name = name;
      this.index = schema.fieldIndex(name);
    }

    /** The named columns of {@code schema}, in the order given. */
    static Field[] all(StructType schema, List<String> names) {
      return names.stream().map(name -> new Field(schema, name)).toArray(Field[]::new);
    }

    boolean isNull(Row row) {
      return row.isNullAt(index);
    }

    Object get(Row row) {
      return row.get(index);
    }

    long getLong(Row row) {
      return row.getLong(index);
    }

    boolean getBoolean(Row row) {
      return row.getBoolean(index);
    }

    String getString(Row row) {
      return row.getString(index);
    }

    /** The column as a long whatever its whole-number type, or null. */
    Long asLong(Row row) {
      return row.isNullAt(index) ? null : ((Number) row.get(index)).longValue();
    }

    /** Set this column in a row's values (see {@link Rows#values}). */
    void set(Object[] values, Object value) {
      values[index] = value;
    }
  }

  /** What a row is to a keyed operator: a change to the key's state, a look-up of it, or neither. */
  enum Part { CHANGE, LOOKUP, PASS }

  /** A key's rows of one batch split by {@link Part}, each list in arrival order. */
  static final class Split {
    final List<Row> changes = new ArrayList<>();
    final List<Row> lookups = new ArrayList<>();
    /** The rows passed through unchanged; the operators add their own output after them. */
    final List<Row> passed = new ArrayList<>();
  }

  static Split split(scala.collection.Iterator<Row> rows, Function<Row, Part> partOf) {
    Split split = new Split();
    while (rows.hasNext()) {
      Row row = rows.next();
      switch (partOf.apply(row)) {
        case CHANGE:
          split.changes.add(row);
          break;
        case LOOKUP:
          split.lookups.add(row);
          break;
        default:
          split.passed.add(row);
      }
    }
    return split;
  }

  /**
   * Rows by the given columns, each read as a long (any whole-number type), a null before any
   * value: the order Spark read a changelog in (source partition, position), or a version's.
   */
  static Comparator<Row> readOrder(Field[] order) {
    return (a, b) -> {
      for (Field field : order) {
        long x = a.isNullAt(field.index) ? Long.MIN_VALUE : ((Number) a.get(field.index)).longValue();
        long y = b.isNullAt(field.index) ? Long.MIN_VALUE : ((Number) b.get(field.index)).longValue();
        if (x != y) {
          return Long.compare(x, y);
        }
      }
      return 0;
    };
  }

  /** A copy of the row's values, to change some and build a new row. */
  static Object[] values(Row row) {
    Object[] values = new Object[row.length()];
    for (int i = 0; i < values.length; i++) {
      values[i] = row.get(i);
    }
    return values;
  }

  /** The row (of {@code schema}) with one column set to {@code value}. */
  static Row with(Row row, Field field, Object value, StructType schema) {
    Object[] values = values(row);
    field.set(values, value);
    return new GenericRowWithSchema(values, schema);
  }

  /** The schema of the given columns, as {@code schema} declares them. */
  static StructType schemaOf(StructType schema, Field[] fields) {
    return new StructType(Arrays.stream(fields).map(field -> schema.fields()[field.index])
        .toArray(StructField[]::new));
  }

  /** The given columns of a row, as a row of {@code schema} (see {@link #schemaOf}). */
  static Row project(Row row, Field[] fields, StructType schema) {
    Object[] values = new Object[fields.length];
    for (int i = 0; i < fields.length; i++) {
      values[i] = fields[i].get(row);
    }
    return new GenericRowWithSchema(values, schema);
  }

  /** The list state's rows (none when it is empty). */
  static List<Row> load(ListState<Row> state) {
    List<Row> rows = new ArrayList<>();
    if (state.exists()) {
      CollectionConverters.asJava(state.get()).forEachRemaining(rows::add);
    }
    return rows;
  }

  /** Make {@code rows} the list state's whole content (a ListState cannot be put empty). */
  static void replace(ListState<Row> state, List<Row> rows) {
    if (rows.isEmpty()) {
      state.clear();
    } else {
      state.put(rows.toArray(new Row[0]));
    }
  }
}
