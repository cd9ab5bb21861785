package statefulstreams.flinkpeer;

import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * The parse step of one topic: each message becomes a record of its topic (a {@link Change}
 * for a changelog, a {@link PendingOrder} for an order), or a {@link DeadLetter} on the
 * {@link #DEAD_LETTERS} side output. No payload, whatever its bytes, fails the job.
 */
public class ParseMessages<T> extends ProcessFunction<PulsarMessage, T> {
    public static final OutputTag<DeadLetter> DEAD_LETTERS = new OutputTag<>("dead-letters") {};

    /** What a topic's messages become. */
    public enum Topic { USERS, ITEMS, ORDERS }

    private final Topic topic;
    private final String topicName;
    private transient WireFormat wire;

    public ParseMessages(Topic topic, String topicName) {
        this.topic = topic;
        this.topicName = topicName;
    }

    @Override
    public void open(Configuration parameters) {
        wire = new WireFormat();
    }

    @Override
    @SuppressWarnings("unchecked")
    public void processElement(PulsarMessage message, Context context, Collector<T> out) {
        byte[] payload = message.payload == null ? new byte[0] : message.payload;
        try {
            Object record;
            switch (topic) {
                case USERS:
                    record = payload.length == 0 ? new Change<User>(WireFormat.tombstoneKey(message.key), null)
                            : change(wire.parseUser(payload));
                    break;
                case ITEMS:
                    record = payload.length == 0 ? new Change<Item>(WireFormat.tombstoneKey(message.key), null)
                            : change(wire.parseItem(payload));
                    break;
                default:
                    record = new PendingOrder(wire.parseOrder(payload), message.publishedAt, message.messageId);
            }
            out.collect((T) record);
        } catch (WireFormat.BadMessage exc) {
            context.output(DEAD_LETTERS, deadLetter(message, payload, exc.getMessage()));
        } catch (RuntimeException exc) { // a parser's own failure: still one dead letter, never a failed job
            context.output(DEAD_LETTERS, deadLetter(message, payload,
                    "cannot read the message: " + exc.getClass().getSimpleName() + ": " + exc.getMessage()));
        }
    }

    private static Change<User> change(User user) {
        return new Change<>(user.id, user);
    }

    private static Change<Item> change(Item item) {
        return new Change<>(item.id, item);
    }

    private DeadLetter deadLetter(PulsarMessage message, byte[] payload, String error) {
        DeadLetter dead = new DeadLetter();
        dead.sourceTopic = topicName;
        dead.sourceMessageId = message.messageId;
        dead.key = message.key;
        dead.payload = text(payload);
        dead.error = error;
        dead.publishedAt = message.publishedAt;
        dead.detectedAt = System.currentTimeMillis();
        return dead;
    }

    /** The payload as text, or base64 when it is not UTF-8 (as the job's dead letters keep it). */
    static String text(byte[] payload) {
        try {
            return StandardCharsets.UTF_8.newDecoder().decode(java.nio.ByteBuffer.wrap(payload)).toString();
        } catch (CharacterCodingException exc) {
            return "base64:" + Base64.getEncoder().encodeToString(payload);
        }
    }
}
