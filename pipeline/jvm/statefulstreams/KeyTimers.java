package statefulstreams;

import java.util.Objects;

import org.apache.spark.sql.streaming.StatefulProcessorHandle;

/**
 * Where a key of {@link VersionedLookup} keeps its event-time timers: at most two, both in its
 * head ({@link VersionHead}), so that a key with waiting orders costs Spark's timer store as
 * little as it can (issue 31: registering, deleting and re-registering a key's one timer was the
 * largest part of event time's extra cost per order).
 * <ul>
 *   <li>the pruning timer, at the time pruning would drop something; it stays registered while
 *       orders wait (before, a waiting order replaced it by an earlier timer, a delete and a
 *       register, and it was registered again once the orders were decided);</li>
 *   <li>the waiting orders' timer, only when they may be due before the pruning timer; one due
 *       at or after a registered one is left alone (the earlier timer's call looks again).</li>
 * </ul>
 * Either timer's call does whatever work is due (decide the due orders, prune) and then places
 * the timers again ({@link #place}). A timer at or below the watermark is spent: Spark fires it
 * in this batch (if it has not already) and removes it itself, so it is never deleted here.
 */
final class KeyTimers {
  private KeyTimers() {
  }

  /**
   * Register and delete the key's timers so that they stand at {@code prune} (null: nothing to
   * prune) and at {@code due} when it is before {@code prune} (null: no order waits); both
   * above the watermark. Updates the head's record; true when it changed.
   */
  static boolean place(VersionHead head, Long due, Long prune, StatefulProcessorHandle handle) {
    boolean changed = false;
    if (!Objects.equals(prune, head.pruneTimerMs)) {
      if (head.pruneTimerMs != null) {
        handle.deleteTimer(head.pruneTimerMs);
      }
      if (prune != null && prune.equals(head.dueTimerMs)) {
        head.dueTimerMs = null;  // the orders' timer becomes the pruning one: one timer, two jobs
      } else if (prune != null) {
        handle.registerTimer(prune);
      }
      head.pruneTimerMs = prune;
      changed = true;
    }
    if (due != null && head.dueTimerMs != null && head.dueTimerMs <= due) {
      return changed;  // early enough: its call looks again
    }
    if (head.dueTimerMs != null) {  // no order waits, or one is due before it
      handle.deleteTimer(head.dueTimerMs);
      head.dueTimerMs = null;
      changed = true;
    }
    if (due != null && (prune == null || due < prune)) {
      handle.registerTimer(due);
      head.dueTimerMs = due;
      changed = true;
    }
    return changed;
  }
}
