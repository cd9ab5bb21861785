package statefulstreams.flinkpeer;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.connector.pulsar.source.reader.deserializer.PulsarDeserializationSchema;
import org.apache.flink.util.Collector;
import org.apache.pulsar.client.api.Message;

/**
 * Keeps the message key, the publish time and the message id beside the raw payload: the
 * payload is parsed downstream, where a bad one becomes a dead letter instead of failing the
 * source (a deserializer that throws fails the whole job).
 */
public class PulsarMessageSchema implements PulsarDeserializationSchema<PulsarMessage> {
    @Override
    public void deserialize(Message<byte[]> message, Collector<PulsarMessage> out) {
        out.collect(new PulsarMessage(message.hasKey() ? message.getKey() : null, message.getValue(),
                message.getPublishTime(), message.getMessageId().toString()));
    }

    @Override
    public TypeInformation<PulsarMessage> getProducedType() {
        return TypeInformation.of(PulsarMessage.class);
    }
}
