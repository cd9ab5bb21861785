package statefulstreams.flinkpeer;

/**
 * One message as read from a topic, before its payload is parsed: what the parse step and the
 * sinks need of the message itself. A POJO, so Flink serialises it without Kryo.
 */
public class PulsarMessage {
    public String key;
    public byte[] payload;
    /** The broker's publish time, epoch milliseconds. */
    public long publishedAt;
    public String messageId;

    public PulsarMessage() {}

    public PulsarMessage(String key, byte[] payload, long publishedAt, String messageId) {
        this.key = key;
        this.payload = payload;
        this.publishedAt = publishedAt;
        this.messageId = messageId;
    }
}
