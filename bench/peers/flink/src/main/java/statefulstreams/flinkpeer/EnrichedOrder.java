package statefulstreams.flinkpeer;

/** A row of the enriched sink (written with snake_case names; times in epoch ms, null = none). */
public class EnrichedOrder {
    public long invoiceId;
    public long lineItemId;
    public long userId;
    public long itemId;
    public double price;
    public Long createdAt;
    public Long paidAt;
    public String userFirstName;
    public String userLastName;
    public String userEmail;
    public Long userCreatedAt;
    public String itemName;
    public String itemCategory;
    public String itemAdjective;
    public String itemModifier;
    public double itemPrice;
    public long waitedMs;
    public long publishedAt;
    public long enrichedAt;
    public String sourceTopic;
    public String sourceMessageId;

    public EnrichedOrder() {}
}
