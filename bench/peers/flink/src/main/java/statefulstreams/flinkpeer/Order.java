package statefulstreams.flinkpeer;

/** One order line, as the orders topic carries it. */
public class Order {
    public long invoiceId;
    public long lineItemId;
    public long userId;
    public long itemId;
    public String itemName;
    public String itemCategory;
    public double price;
    public long createdAt;
    public long paidAt = -1;

    public Order() {}
}
