package statefulstreams;

import java.io.Serializable;
import java.util.List;

/**
 * What a lookup operator ({@link ChangelogLookup}, {@link VersionedLookup}) is told, built on the
 * driver (from Python through py4j, pipeline/enrich/lookups.py) with one named setter per part;
 * the operator's {@code apply} finds the columns in its input's schema ({@link LookupColumns}).
 *
 * <pre>{@code
 * new LookupSpec().key("user_id").role("lookup_role").state(List.of("user_first_name", "user_email"))
 *     .found("user_state").firstSeen("first_seen_ms").waited("waited_ms")
 *     .readOrder(List.of("source_partition", "position")).maxWaitMs(5_000)
 * }</pre>
 * {@link VersionedLookup} also needs {@code eventMs}, {@code late}, {@code asOf},
 * {@code allowedLatenessMs} and {@code futureAfterMs}.
 */
public final class LookupSpec implements Serializable {
  private static final long serialVersionUID = 1L;
  String key, role, found, firstSeen, waited, eventMs, late, asOf;
  List<String> state = List.of(), readOrder = List.of();
  long maxWaitMs, allowedLatenessMs, futureAfterMs;
  boolean joinLate;

  /** The key column: the operator runs once per key (null keys as 0). */
  public LookupSpec key(String column) { key = column; return this; }

  /** The role column ({@link LookupRole}). */
  public LookupSpec role(String column) { role = column; return this; }

  /** The state columns: set by a changelog row, attached to a lookup row. */
  public LookupSpec state(List<String> columns) { state = List.copyOf(columns); return this; }

  /** The column that receives the {@link LookupOutcome}. */
  public LookupSpec found(String column) { found = column; return this; }

  /** The column with the time a lookup row was first seen (processing time). */
  public LookupSpec firstSeen(String column) { firstSeen = column; return this; }

  /** The column that receives how long a lookup row waited. */
  public LookupSpec waited(String column) { waited = column; return this; }

  /** The columns Spark read a changelog's rows in the order of (whole numbers). */
  public LookupSpec readOrder(List<String> columns) { readOrder = List.copyOf(columns); return this; }

  /** How long a lookup row waits for a key that has no record (0: not at all). */
  public LookupSpec maxWaitMs(long ms) { maxWaitMs = ms; return this; }

  /** Event time: the column with the row's event time (an order's, a version's). */
  public LookupSpec eventMs(String column) { eventMs = column; return this; }

  /** Event time: the column with an order's lateness flag, and a late version's mark. */
  public LookupSpec late(String column) { late = column; return this; }

  /** Event time: the column that receives the time of the version an order was enriched as of. */
  public LookupSpec asOf(String column) { asOf = column; return this; }

  /** Event time: how far behind the watermark a time may be before it is late. */
  public LookupSpec allowedLatenessMs(long ms) { allowedLatenessMs = ms; return this; }

  /** Event time: how far past the watermark an order's time may be before it is from the future. */
  public LookupSpec futureAfterMs(long ms) { futureAfterMs = ms; return this; }

  /**
   * Event time: a late lookup row is decided at once with the versions the key still holds (as
   * Flink's temporal join does), instead of with none ({@code late}). Its late column stays 1.
   */
  public LookupSpec joinLate(boolean join) { joinLate = join; return this; }
}
