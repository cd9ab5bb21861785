package statefulstreams.flinkpeer;

/**
 * An order on its way through the lookups: what each lookup found (null where it found
 * nothing in time), and when the first lookup first saw it, from which {@code max_wait} runs.
 */
public class PendingOrder {
    public Order order;
    public User user;
    public Item item;
    public long publishedAt;
    public String messageId;
    /** Processing time the order reached the first lookup, epoch ms. */
    public long firstSeenMs;

    public PendingOrder() {}

    public PendingOrder(Order order, long publishedAt, String messageId) {
        this.order = order;
        this.publishedAt = publishedAt;
        this.messageId = messageId;
    }
}
