package statefulstreams;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.functions;

/**
 * Groups rows by one of their columns for {@code transformWithState}, the way every operator in
 * this package is keyed.
 *
 * <p>{@code Dataset.groupByKey} takes a function of the row, so Spark first turns each whole row
 * into a Java {@code Row} just to read its key, then turns it back, before the operator turns it
 * into a {@code Row} once more. Grouping by the column itself ({@code groupBy(column).as(...)})
 * lets Spark read the key from its own row format: one full conversion less per row and operator.
 * A null key groups as {@code whenNull}, as the operators expect. The key column is named
 * {@code value}, as {@code groupByKey} names it, so the state's key schema (what checkpoints hold
 * and the state data source reads) is unchanged.
 */
final class KeyedByColumn {
  private KeyedByColumn() {
  }

  static <K> KeyValueGroupedDataset<K, Row> group(Dataset<Row> input, String key, Encoder<K> keyEncoder,
                                                  Object whenNull) {
    Column keyColumn = functions.coalesce(input.col(key), functions.lit(whenNull)).as("value");
    return input.groupBy(keyColumn).as(keyEncoder, Encoders.row(input.schema()));
  }
}
