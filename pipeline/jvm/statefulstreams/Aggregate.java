package statefulstreams;

import java.util.Locale;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;

/**
 * The aggregate functions {@link GroupAggregate} computes, and the type of each one's result
 * ({@code COUNT_DISTINCT} is SQL's {@code COUNT(DISTINCT x)}).
 */
enum Aggregate {
  COUNT, COUNT_DISTINCT, SUM, MIN, MAX;

  /** The function a SQL name names, in any case. */
  static Aggregate of(String name) {
    try {
      return valueOf(name.toUpperCase(Locale.ROOT));
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("unsupported aggregate " + name
          + "; supported: COUNT, COUNT_DISTINCT, SUM, MIN, MAX", e);
    }
  }

  /**
   * The result's type over an input of {@code input} (a long for COUNT(*)): COUNT and
   * COUNT_DISTINCT a long, SUM a long over whole numbers and a double otherwise, MIN and MAX their
   * input's type.
   */
  DataType resultType(DataType input) {
    switch (this) {
      case COUNT:
      case COUNT_DISTINCT:
        return DataTypes.LongType;
      case SUM:
        return isWhole(input) ? DataTypes.LongType : DataTypes.DoubleType;
      default:
        return input;
    }
  }

  private static boolean isWhole(DataType type) {
    return type.equals(DataTypes.LongType) || type.equals(DataTypes.IntegerType)
        || type.equals(DataTypes.ShortType) || type.equals(DataTypes.ByteType);
  }
}
