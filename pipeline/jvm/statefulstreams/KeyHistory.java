package statefulstreams;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Objects;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.ListState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

import statefulstreams.Rows.Field;

/**
 * The versions one key holds in {@link VersionedLookup}, for one call: the newest
 * {@link #RECENT} in the key's head ({@link VersionHead}, read once per call anyway), the older
 * ones in its {@code versions} list (ListState, oldest first). The list is read only when a
 * call needs a version older than the head's, or rewrites the history; so a key with up to
 * {@link #RECENT} versions (most keys, once pruning keeps what the watermark still needs) never
 * touches it, and an order at or after the head's oldest version reads the head alone.
 *
 * <p>Call order: built with the head just read; {@link #add} the call's versions, look versions
 * up ({@link #newest}, {@link #covering}), {@link #prune} if the watermark allows, then
 * {@link #store}; the caller then writes the head when {@link #headChanged}.
 */
final class KeyHistory {
  /** Versions a head holds; an older one moves to the list (an append, nothing read). */
  static final int RECENT = 4;

  /** The columns of a version row: time, read order, tombstone, the state columns (found once, on the driver). */
  static final class Columns implements Serializable {
    private static final long serialVersionUID = 1L;
    final StructType schema;
    final Field versionMs, tombstone;
    final Field[] order;  // version_ms, then the read order columns
    final Field[] state;
    final Field[] identity;  // tombstone and state: what makes two versions of one time the same

    Columns(LookupColumns lookup) {
      List<StructField> fields = new ArrayList<>();
      List<String> orderNames = new ArrayList<>();
      fields.add(DataTypes.createStructField("version_ms", DataTypes.LongType, false));
      orderNames.add("version_ms");
      for (int i = 0; i < lookup.order.length; i++) {
        fields.add(DataTypes.createStructField("read_" + i, DataTypes.LongType, true));
        orderNames.add("read_" + i);
      }
      fields.add(DataTypes.createStructField("tombstone", DataTypes.BooleanType, false));
      fields.addAll(List.of(lookup.stateSchema.fields()));
      this.schema = DataTypes.createStructType(fields);
      this.versionMs = new Field(schema, "version_ms");
      this.tombstone = new Field(schema, "tombstone");
      this.order = Field.all(schema, orderNames);
      this.state = Field.all(schema, List.of(lookup.stateSchema.fieldNames()));
      List<String> identityNames = new ArrayList<>(List.of("tombstone"));
      identityNames.addAll(List.of(lookup.stateSchema.fieldNames()));
      this.identity = Field.all(schema, identityNames);
    }

    Comparator<Row> readOrder() {
      return Rows.readOrder(order);
    }
  }

  private final Columns columns;
  private final VersionHead head;
  private final ListState<Row> versions;
  private List<Row> history;  // every version, oldest first; null until loaded
  private int olderLoaded;  // the list's length when loaded
  private boolean historyChanged;
  /** Whether the call changed the head's versions, count or prune_at (the caller writes it back). */
  boolean headChanged;

  KeyHistory(Columns columns, VersionHead head, ListState<Row> versions) {
    this.columns = columns;
    this.head = head;
    this.versions = versions;
  }

  /** The newest version held (a record or a tombstone), or null. */
  Row newest() {
    if (history != null) {
      return history.isEmpty() ? null : history.get(history.size() - 1);
    }
    return head.recent.isEmpty() ? null : head.recent.get(head.recent.size() - 1);
  }

  /** Every version held, oldest first (the list, then the head's), loaded once. */
  List<Row> all() {
    if (history == null) {
      history = head.older > 0 ? loadHeld(versions) : new ArrayList<>();
      olderLoaded = history.size();
      history.addAll(head.recent);
      history.sort(columns.readOrder());
    }
    return history;
  }

  /**
   * Versions, oldest first, that hold every version at or after {@code time} and the one
   * current at it when held: the head's alone when its oldest is at or before {@code time} (or
   * the list is empty), else every version.
   */
  List<Row> covering(long time) {
    if (history != null || head.older == 0) {
      return history != null ? history : head.recent;
    }
    return columns.versionMs.getLong(head.recent.get(0)) <= time ? head.recent : all();
  }

  /**
   * Add a version unless the key holds it; false when it does. A version strictly newer than
   * every held one (the usual case) joins the head's, and the head's oldest moves to the list
   * once they are more than {@link #RECENT}, with nothing read.
   */
  boolean add(Row version) {
    Row newest = newest();
    long at = columns.versionMs.getLong(version);
    if (history == null && (newest == null || at > columns.versionMs.getLong(newest))) {
      int held = head.older + head.recent.size();
      if (held == 0) {
        head.pruneAt = columns.tombstone.getBoolean(version) ? at : null;
      } else if (held == 1) {  // the held one is now the first version, this one the second
        head.pruneAt = columns.tombstone.getBoolean(newest) ? columns.versionMs.getLong(newest) : at;
      }
      head.recent.add(version);
      if (head.recent.size() > RECENT) {
        versions.appendValue(head.recent.remove(0));
        head.older++;
      }
      headChanged = true;
      return true;
    }
    List<Row> held = all();
    if (holds(held, version)) {
      return false;
    }
    held.add(version);
    held.sort(columns.readOrder());
    historyChanged = true;
    return true;
  }

  /** Whether pruning at {@code horizon} would drop something (an older version added may make it so). */
  boolean prunable(long horizon) {
    Long at = historyChanged ? pruneAtOf(history) : head.pruneAt;
    return at != null && at < horizon;
  }

  /**
   * Versions older than {@code horizon} go, except the newest of them unless it is a tombstone
   * ({@code event_rules.prune_versions}). When the newest version is older too, the list goes
   * whole, unread.
   */
  void prune(long horizon) {
    Row newest = newest();
    if (history == null && columns.versionMs.getLong(newest) < horizon) {
      if (head.older > 0) {
        versions.clear();
        head.older = 0;
      }
      head.recent.clear();
      if (!columns.tombstone.getBoolean(newest)) {
        head.recent.add(newest);
      }
      head.pruneAt = null;
      headChanged = true;
      return;
    }
    List<Row> held = all();
    int older = 0;
    while (older < held.size() && columns.versionMs.getLong(held.get(older)) < horizon) {
      older++;
    }
    List<Row> kept = new ArrayList<>();
    if (older > 0 && !columns.tombstone.getBoolean(held.get(older - 1))) {
      kept.add(held.get(older - 1));
    }
    kept.addAll(held.subList(older, held.size()));
    history = kept;
    historyChanged = true;
  }

  /**
   * A loaded history that changed, back into the head (the newest {@link #RECENT}) and the list
   * (the rest), and prune_at from it; nothing when the history was not loaded or did not change.
   */
  void store() {
    if (!historyChanged) {
      return;
    }
    int n = history.size();
    int split = Math.max(0, n - RECENT);
    List<Row> older = history.subList(0, split);
    if (older.isEmpty()) {
      if (olderLoaded > 0) {
        versions.clear();
      }
    } else {
      versions.put(older.toArray(new Row[0]));
    }
    head.older = older.size();
    head.recent = new ArrayList<>(history.subList(split, n));
    head.pruneAt = pruneAtOf(history);
    headChanged = true;
  }

  /**
   * The least pruning horizon past which pruning {@code held} (oldest first) drops something:
   * its first version's time when that is a tombstone, else its second's; null when it has one
   * record or nothing.
   */
  private Long pruneAtOf(List<Row> held) {
    if (held.isEmpty()) {
      return null;
    }
    if (columns.tombstone.getBoolean(held.get(0))) {
      return columns.versionMs.getLong(held.get(0));
    }
    return held.size() > 1 ? Long.valueOf(columns.versionMs.getLong(held.get(1))) : null;
  }

  /**
   * The rows of a list state the head counts as not empty: read without {@link Rows#load}'s
   * existence check, a second RocksDB read of the same key.
   */
  static List<Row> loadHeld(ListState<Row> state) {
    List<Row> rows = new ArrayList<>();
    CollectionConverters.asJava(state.get()).forEachRemaining(rows::add);
    return rows;
  }

  /** Whether {@code held} holds a version of the same time and the same record (or tombstone). */
  private boolean holds(List<Row> held, Row version) {
    for (Row each : held) {
      if (columns.versionMs.getLong(each) != columns.versionMs.getLong(version)) {
        continue;
      }
      boolean same = true;
      for (int i = 0; i < columns.identity.length && same; i++) {
        same = Objects.equals(columns.identity[i].get(each), columns.identity[i].get(version));
      }
      if (same) {
        return true;
      }
    }
    return false;
  }
}
