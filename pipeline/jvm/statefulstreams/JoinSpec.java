package statefulstreams;

import java.io.Serializable;
import java.util.List;
import java.util.stream.Collectors;

/**
 * What {@link UpsertJoin} is told, built on the driver (from Python through py4j,
 * pipeline/sql/runner.py) with one named setter per part.
 *
 * <pre>{@code
 * new JoinSpec().key("key").side("side").op("op")
 *     .sides(List.of(List.of("s0_accountId", "s0_id"), List.of("s1_favoriteColor")))
 *     .readOrder(List.of("source_partition", "position")).emitBefore(true).stateTtlMs(3_600_000)
 * }</pre>
 */
public final class JoinSpec implements Serializable {
  private static final long serialVersionUID = 1L;
  String key, side, op;
  List<List<String>> sides = List.of();
  List<String> readOrder = List.of();
  boolean emitBefore;
  long stateTtlMs;

  /** The (string) key column the sides are joined on. */
  public JoinSpec key(String column) { key = column; return this; }

  /** The column with the index of the side a row changes (0: the driving, left-most table). */
  public JoinSpec side(String column) { side = column; return this; }

  /** The op column ({@link ChangeOp}). */
  public JoinSpec op(String column) { op = column; return this; }

  /** Each side's value columns, in side order. */
  public JoinSpec sides(List<List<String>> columns) {
    sides = columns.stream().map(List::copyOf).collect(Collectors.toUnmodifiableList());
    return this;
  }

  /** The columns Spark read the changelogs' rows in the order of (whole numbers). */
  public JoinSpec readOrder(List<String> columns) { readOrder = List.copyOf(columns); return this; }

  /** Whether a changed row's old joined row is emitted too (op {@code before}), for an aggregation. */
  public JoinSpec emitBefore(boolean emit) { emitBefore = emit; return this; }

  /**
   * Flink's {@code table.exec.state.ttl} in milliseconds: a side's row not written for that long
   * (processing time) is dropped, each side on its own; 0 (the default) keeps every row.
   */
  public JoinSpec stateTtlMs(long millis) {
    if (millis < 0) {
      throw new IllegalArgumentException("stateTtlMs " + millis + " is negative; give 0 (no TTL) or more");
    }
    stateTtlMs = millis;
    return this;
  }
}
