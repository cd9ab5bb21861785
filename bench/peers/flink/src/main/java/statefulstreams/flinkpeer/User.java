package statefulstreams.flinkpeer;

/** The latest version of a user, as the users topic carries it (times in epoch ms, -1 = none). */
public class User {
    public long id;
    public String firstName;
    public String lastName;
    public String emailAddress;
    public long createdAt = -1;
    public long deletedAt = -1;
    public long mergedAt = -1;
    public long parentUserId = -1;

    public User() {}
}
