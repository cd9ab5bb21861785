package statefulstreams.flinkpeer;

/** The latest version of an item, as the items topic carries it. */
public class Item {
    public long id;
    public long createdAt = -1;
    public String adjective;
    public String category;
    public String modifier;
    public String name;
    public double price;

    public Item() {}
}
