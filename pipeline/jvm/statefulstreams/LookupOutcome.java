package statefulstreams;

import java.util.Locale;

/**
 * What a lookup wrote in a row's found column: {@code found} or {@code missing}; in event time
 * also {@code late} (older than the watermark allows) and {@code future} (too far past it).
 */
enum LookupOutcome {
  FOUND, MISSING, LATE, FUTURE;

  /** The found column's value. */
  final String value = name().toLowerCase(Locale.ROOT);
}
