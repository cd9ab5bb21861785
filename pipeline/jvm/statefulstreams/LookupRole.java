package statefulstreams;

import java.util.Locale;

/**
 * The role of a lookup's input row, the value of its role column (pipeline/enrich/lookups.py
 * writes them): {@code set} (a changelog upsert), {@code delete} (a tombstone), {@code lookup}
 * (a row to enrich, an order) or anything else, which passes through unchanged.
 */
enum LookupRole {
  SET(Rows.Part.CHANGE), DELETE(Rows.Part.CHANGE), LOOKUP(Rows.Part.LOOKUP), PASS(Rows.Part.PASS);

  private static final LookupRole[] ALL = values();
  /** The role column's value. */
  final String value = name().toLowerCase(Locale.ROOT);
  final Rows.Part part;

  LookupRole(Rows.Part part) {
    this.part = part;
  }

  /** The role a role column's value names; {@link #PASS} for null or any other value. */
  static LookupRole of(String value) {
    for (LookupRole role : ALL) {
      if (role.value.equals(value)) {
        return role;
      }
    }
    return PASS;
  }
}
