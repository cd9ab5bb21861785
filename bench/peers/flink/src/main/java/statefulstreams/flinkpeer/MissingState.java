package statefulstreams.flinkpeer;

/** A row of the missing_state sink: the order, and why it could not be enriched in time. */
public class MissingState {
    public long invoiceId;
    public long lineItemId;
    public long userId;
    public long itemId;
    public String itemName;
    public String itemCategory;
    public double price;
    public Long createdAt;
    public Long paidAt;
    /** {@code user}, {@code item} or {@code user_and_item}: every lookup that found nothing. */
    public String reason;
    public long waitedMs;
    public long publishedAt;
    public long detectedAt;
    public String sourceTopic;
    public String sourceMessageId;

    public MissingState() {}
}
