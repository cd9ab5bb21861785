package statefulstreams.flinkpeer;

import java.util.ArrayList;
import java.util.List;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.functions.co.KeyedCoProcessFunction;
import org.apache.flink.util.Collector;

/**
 * One lookup, keyed by the id it looks up: the orders on input 1, that id's changelog on
 * input 2. Keyed state (RocksDB) holds the latest record of the key and the orders waiting
 * for it.
 *
 * <p>Call order, per key: a changelog record replaces (or a tombstone clears) the latest
 * record, then releases every waiting order with it. An order takes the latest record if
 * there is one; otherwise it waits, with a processing-time timer at its first sight plus
 * {@code maxWaitMs}; when the timer fires, the orders whose wait is over go on without the
 * record (the next lookup still checks its own, so the reason names every missing part).
 * With {@code maxWaitMs} 0 nothing waits. Orders and changelogs are taken in whatever order
 * Flink's inputs deliver them (the original job's behaviour): a changelog message is not
 * guaranteed to be applied before an order read after it from another topic.
 */
public class LookupFunction<V> extends KeyedCoProcessFunction<Long, PendingOrder, Change<V>, PendingOrder> {
    private final Lookup lookup;
    private final long maxWaitMs;
    private transient ValueState<V> latest;
    private transient ListState<PendingOrder> waiting;

    public LookupFunction(Lookup lookup, long maxWaitMs) {
        this.lookup = lookup;
        this.maxWaitMs = maxWaitMs;
    }

    @Override
    public void open(Configuration parameters) {
        latest = getRuntimeContext().getState(new ValueStateDescriptor<>("latest-" + lookup.reason, lookup.<V>stateType()));
        waiting = getRuntimeContext().getListState(new ListStateDescriptor<>("waiting-" + lookup.reason, PendingOrder.class));
    }

    @Override
    public void processElement1(PendingOrder pending, Context context, Collector<PendingOrder> out) throws Exception {
        long now = context.timerService().currentProcessingTime();
        if (pending.firstSeenMs == 0) {
            pending.firstSeenMs = now;
        }
        V value = latest.value();
        if (value != null) {
            lookup.attach(pending, value);
            out.collect(pending);
        } else if (maxWaitMs > 0 && now - pending.firstSeenMs < maxWaitMs) {
            waiting.add(pending);
            context.timerService().registerProcessingTimeTimer(pending.firstSeenMs + maxWaitMs);
        } else {
            out.collect(pending); // missing: this lookup attaches nothing
        }
    }

    @Override
    public void processElement2(Change<V> change, Context context, Collector<PendingOrder> out) throws Exception {
        if (change.value == null) {
            latest.clear();
            return;
        }
        latest.update(change.value);
        Iterable<PendingOrder> waited = waiting.get();
        if (waited == null || !waited.iterator().hasNext()) {
            return;
        }
        for (PendingOrder pending : waited) {
            lookup.attach(pending, change.value);
            out.collect(pending);
        }
        waiting.clear(); // their timers stay registered and find nothing to release
    }

    @Override
    public void onTimer(long timestamp, OnTimerContext context, Collector<PendingOrder> out) throws Exception {
        Iterable<PendingOrder> waited = waiting.get();
        if (waited == null) {
            return;
        }
        List<PendingOrder> still = new ArrayList<>();
        for (PendingOrder pending : waited) {
            if (pending.firstSeenMs + maxWaitMs <= timestamp) {
                out.collect(pending);
            } else {
                still.add(pending);
            }
        }
        waiting.update(still);
    }
}
