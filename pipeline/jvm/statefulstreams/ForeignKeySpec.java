package statefulstreams;

import java.io.Serializable;
import java.util.List;

/**
 * What {@link ForeignKeyJoin} is told, built on the driver (from Python through py4j,
 * pipeline/sql/foreign_key.py) with one named setter per part.
 *
 * <pre>{@code
 * new ForeignKeySpec().foreignKey("fk_key").key("key").op("op")
 *     .driving(List.of("s0_uid", "s0_accountId")).referenced(List.of("s1_id", "s1_name"))
 *     .readOrder(List.of("source_partition", "position")).inner(false).stateTtlMs(3_600_000)
 * }</pre>
 */
public final class ForeignKeySpec implements Serializable {
  private static final long serialVersionUID = 1L;
  String foreignKey, key, op;
  List<String> driving = List.of();
  List<String> referenced = List.of();
  List<String> readOrder = List.of();
  boolean inner;
  long stateTtlMs;

  /** The (string) column the rows are keyed by: the foreign key value, encoded by Python. */
  public ForeignKeySpec foreignKey(String column) { foreignKey = column; return this; }

  /** The column with a driving row's primary key, which keys the joined rows. */
  public ForeignKeySpec key(String column) { key = column; return this; }

  /** The op column ({@link ChangeOp}). */
  public ForeignKeySpec op(String column) { op = column; return this; }

  /** The driving table's value columns (kept per referencing row). */
  public ForeignKeySpec driving(List<String> columns) { driving = List.copyOf(columns); return this; }

  /** The referenced table's value columns (its row, kept per foreign key value). */
  public ForeignKeySpec referenced(List<String> columns) { referenced = List.copyOf(columns); return this; }

  /** The columns Spark read the referenced table's rows in the order of (whole numbers). */
  public ForeignKeySpec readOrder(List<String> columns) { readOrder = List.copyOf(columns); return this; }

  /** An [INNER] JOIN (a driving row has a joined row only while its referenced row is there). */
  public ForeignKeySpec inner(boolean isInner) { inner = isInner; return this; }

  /**
   * Flink's {@code table.exec.state.ttl} in milliseconds: a referencing row or a referenced row
   * not written for that long (processing time) is dropped, each on its own; 0 (the default)
   * keeps every row.
   */
  public ForeignKeySpec stateTtlMs(long millis) {
    if (millis < 0) {
      throw new IllegalArgumentException("stateTtlMs " + millis + " is negative; give 0 (no TTL) or more");
    }
    stateTtlMs = millis;
    return this;
  }
}
