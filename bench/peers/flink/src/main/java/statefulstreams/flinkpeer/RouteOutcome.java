package statefulstreams.flinkpeer;

import java.util.ArrayList;
import java.util.List;
import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * After both lookups: an order that found its user and its item is enriched (main output);
 * any other goes to the {@link #MISSING_STATE} side output with the reason naming every lookup
 * that found nothing ({@code user}, {@code item}, {@code user_and_item}, as
 * pipeline/enrich/rules.py's {@code missing_reason} decides).
 */
public class RouteOutcome extends ProcessFunction<PendingOrder, EnrichedOrder> {
    public static final OutputTag<MissingState> MISSING_STATE = new OutputTag<>("missing-state") {};

    private final String ordersTopic;

    public RouteOutcome(String ordersTopic) {
        this.ordersTopic = ordersTopic;
    }

    /** The missing-state reason, or null when every lookup found its record. */
    static String missingReason(PendingOrder pending) {
        List<String> missing = new ArrayList<>();
        if (pending.user == null) {
            missing.add(Lookup.USER.reason);
        }
        if (pending.item == null) {
            missing.add(Lookup.ITEM.reason);
        }
        return missing.isEmpty() ? null : String.join("_and_", missing);
    }

    @Override
    public void processElement(PendingOrder pending, Context context, Collector<EnrichedOrder> out) {
        long now = context.timerService().currentProcessingTime();
        Order order = pending.order;
        String reason = missingReason(pending);
        if (reason != null) {
            MissingState row = new MissingState();
            row.invoiceId = order.invoiceId;
            row.lineItemId = order.lineItemId;
            row.userId = order.userId;
            row.itemId = order.itemId;
            row.itemName = order.itemName;
            row.itemCategory = order.itemCategory;
            row.price = order.price;
            row.createdAt = time(order.createdAt);
            row.paidAt = time(order.paidAt);
            row.reason = reason;
            row.waitedMs = now - pending.firstSeenMs;
            row.publishedAt = pending.publishedAt;
            row.detectedAt = now;
            row.sourceTopic = ordersTopic;
            row.sourceMessageId = pending.messageId;
            context.output(MISSING_STATE, row);
            return;
        }
        EnrichedOrder row = new EnrichedOrder();
        row.invoiceId = order.invoiceId;
        row.lineItemId = order.lineItemId;
        row.userId = order.userId;
        row.itemId = order.itemId;
        row.price = order.price;
        row.createdAt = time(order.createdAt);
        row.paidAt = time(order.paidAt);
        row.userFirstName = pending.user.firstName;
        row.userLastName = pending.user.lastName;
        row.userEmail = pending.user.emailAddress;
        row.userCreatedAt = time(pending.user.createdAt);
        row.itemName = pending.item.name;
        row.itemCategory = pending.item.category;
        row.itemAdjective = pending.item.adjective;
        row.itemModifier = pending.item.modifier;
        row.itemPrice = pending.item.price;
        row.waitedMs = now - pending.firstSeenMs;
        row.publishedAt = pending.publishedAt;
        row.enrichedAt = now;
        row.sourceTopic = ordersTopic;
        row.sourceMessageId = pending.messageId;
        out.collect(row);
    }

    /** The Java model's -1 means no time. */
    private static Long time(long epochMs) {
        return epochMs < 0 ? null : epochMs;
    }
}
