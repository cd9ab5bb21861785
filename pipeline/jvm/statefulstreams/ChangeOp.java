package statefulstreams;

import java.util.Locale;

/**
 * The op column of the SQL pipelines' rows (pipeline/sql/): {@code upsert} and {@code delete}
 * are changes of a table's row ({@link UpsertJoin}'s input) or of a group's result
 * ({@link GroupAggregate}'s output); {@code before} and {@code after} are a joined row's old and
 * new contributions ({@link UpsertJoin}'s output with emitBefore, {@link GroupAggregate}'s input);
 * {@code expire} is a group whose state a TTL dropped ({@link GroupAggregate}'s output, read by
 * HAVING's {@link UpsertJoin}, which drops the group's last result with it and sends nothing).
 * Any other value (a dead letter) is passed through.
 */
enum ChangeOp {
  UPSERT, DELETE, BEFORE, AFTER, EXPIRE;

  private static final ChangeOp[] ALL = values();
  /** The op column's value. */
  final String value = name().toLowerCase(Locale.ROOT);

  /** The op an op column's value names; null for null or any other value. */
  static ChangeOp of(String value) {
    for (ChangeOp op : ALL) {
      if (op.value.equals(value)) {
        return op;
      }
    }
    return null;
  }
}
