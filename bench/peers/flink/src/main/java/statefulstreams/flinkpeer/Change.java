package statefulstreams.flinkpeer;

/**
 * One changelog message: the new version of the record with this id, or, when {@code value}
 * is null, a tombstone that deletes the id.
 */
public class Change<V> {
    public long id;
    public V value;

    public Change() {}

    public Change(long id, V value) {
        this.id = id;
        this.value = value;
    }
}
