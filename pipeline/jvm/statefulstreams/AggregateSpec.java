package statefulstreams;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;

/**
 * What {@link GroupAggregate} is told, built on the driver (from Python through py4j,
 * pipeline/sql/runner.py) with one named setter per part and one call per aggregate.
 *
 * <pre>{@code
 * new AggregateSpec().groupKey("group_key").member("key").op("op").groups(List.of("s0_accountId"))
 *     .aggregate("COUNT", "", "agg1").aggregate("SUM", "s0_amount", "agg2").stateTtlMs(3_600_000)
 * }</pre>
 */
public final class AggregateSpec implements Serializable {
  private static final long serialVersionUID = 1L;
  String groupKey, member, op;
  List<String> groups = List.of();
  final List<Aggregate> functions = new ArrayList<>();
  final List<String> inputs = new ArrayList<>();  // "" for COUNT(*)
  final List<String> outputs = new ArrayList<>();
  long stateTtlMs;

  /** The (string) column the rows are grouped by: the group's values, encoded. */
  public AggregateSpec groupKey(String column) { groupKey = column; return this; }

  /** The column with a row's primary key: one member of its group. */
  public AggregateSpec member(String column) { member = column; return this; }

  /** The op column ({@link ChangeOp}). */
  public AggregateSpec op(String column) { op = column; return this; }

  /** The group's columns, copied to its result rows. */
  public AggregateSpec groups(List<String> columns) { groups = List.copyOf(columns); return this; }

  /**
   * Flink's {@code table.exec.state.ttl} in milliseconds: a group not updated for that long
   * (processing time) is dropped whole, members and last result; 0 (the default) keeps every group.
   */
  public AggregateSpec stateTtlMs(long millis) {
    if (millis < 0) {
      throw new IllegalArgumentException("stateTtlMs " + millis + " is negative; give 0 (no TTL) or more");
    }
    stateTtlMs = millis;
    return this;
  }

  /**
   * One more aggregate: {@code function} ({@link Aggregate}, any case) of the {@code input}
   * column (empty for COUNT(*)) into a new column named {@code output}.
   */
  public AggregateSpec aggregate(String function, String input, String output) {
    functions.add(Aggregate.of(function));
    inputs.add(input);
    outputs.add(output);
    return this;
  }
}
