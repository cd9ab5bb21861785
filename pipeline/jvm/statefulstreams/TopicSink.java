package statefulstreams;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.IntBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.TimeUnit;

import org.apache.pulsar.client.api.AuthenticationFactory;
import org.apache.pulsar.client.api.ClientBuilder;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;

/**
 * A SQL pipeline's upsert topic, written from the JVM with the Java Pulsar client: the topic
 * sender of {@code sql.topic_sender = jvm} (pipeline/sql/jvm_sender.py), where Python's client
 * would pay a call per message.
 *
 * <p>Call order, all on the driver: {@link #open} once per target topic when the pipeline starts,
 * {@link #send} once per micro-batch inside foreachBatch, before the batch's tables commit, and
 * {@link #close} when the pipeline stops.
 *
 * <p>Guarantees: {@link #send} hands the rows to one producer in the Dataset's order, each keyed
 * by its key, so a key's messages keep their order; it returns once every message is
 * acknowledged by the broker, and throws if one was not, so the batch fails and Spark re-runs it.
 * At least once, as Python's sender: a re-run batch sends its messages again, which an upsert
 * topic absorbs. The producer batches as pipeline/feed/producers.py's does (up to 1,000 messages
 * or 5 ms a batch, waiting rather than failing when 10,000 are pending).
 */
public final class TopicSink implements AutoCloseable {
  private final PulsarClient client;
  private final Producer<byte[]> producer;

  private TopicSink(PulsarClient client, Producer<byte[]> producer) {
    this.client = client;
    this.producer = producer;
  }

  /**
   * A client and a producer for {@code topic} on {@code serviceUrl}; {@code authToken} (null or
   * empty: none) is {@code pulsar.auth_token}'s JWT.
   */
  public static TopicSink open(String serviceUrl, String authToken, String topic) throws PulsarClientException {
    ClientBuilder builder = PulsarClient.builder().serviceUrl(serviceUrl)
        .operationTimeout(10, TimeUnit.SECONDS).connectionTimeout(5, TimeUnit.SECONDS);
    if (authToken != null && !authToken.isEmpty()) {
      builder.authentication(AuthenticationFactory.token(authToken));
    }
    PulsarClient client = builder.build();
    try {
      Producer<byte[]> producer = client.newProducer(Schema.BYTES).topic(topic)
          .enableBatching(true).batchingMaxPublishDelay(5, TimeUnit.MILLISECONDS).batchingMaxMessages(1000)
          .blockIfQueueFull(true).maxPendingMessages(10_000).create();
      return new TopicSink(client, producer);
    } catch (PulsarClientException | RuntimeException e) {
      client.close();
      throw e;
    }
  }

  /**
   * Sends the messages of {@code batch} in order, keyed, and waits for every acknowledgement.
   * {@code batch} holds n messages in Arrow's layout of two string columns, little-endian (built
   * by pipeline/sql/jvm_sender.py encode_batch from the Arrow columns, without a per-row step):
   * <pre>
   * int32 n | int32 keyOffsets[n + 1] | int32 payloadOffsets[n + 1] | key bytes (UTF-8) | payload bytes
   * </pre>
   * each column's offsets starting at 0. A delete's payload is empty. Bytes rather than a Dataset:
   * the rows are on the driver already, and a Dataset made of them costs Spark jobs to read back
   * (1 to 3 s for 200k rows, against this call's tens of milliseconds to decode).
   *
   * @return the number of messages sent
   * @throws IllegalArgumentException if {@code batch} is not laid out as above
   * @throws IllegalStateException naming the topic and the first failure, if a send failed
   */
  public long send(byte[] batch) {
    ByteBuffer buffer = ByteBuffer.wrap(batch).order(ByteOrder.LITTLE_ENDIAN);
    int n = buffer.getInt(0);
    long keysAt = 4 + 8L * (n + 1L);
    if (n < 0 || keysAt > batch.length) {
      throw new IllegalArgumentException("a message batch of " + batch.length + " bytes cannot hold " + n + " messages");
    }
    IntBuffer keyOffsets = buffer.slice(4, 4 * (n + 1)).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer();
    IntBuffer payloadOffsets = buffer.slice(4 + 4 * (n + 1), 4 * (n + 1)).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer();
    int payloadsAt = (int) keysAt + keyOffsets.get(n);
    if (keyOffsets.get(0) != 0 || payloadOffsets.get(0) != 0 || (long) payloadsAt + payloadOffsets.get(n) != batch.length) {
      throw new IllegalArgumentException("a message batch of " + n + " messages has " + batch.length
          + " bytes, which its offsets do not account for");
    }
    List<CompletableFuture<MessageId>> pending = new ArrayList<>(n);
    for (int row = 0; row < n; row++) {
      int key = keyOffsets.get(row);
      int payload = payloadOffsets.get(row);
      pending.add(producer.newMessage()
          .key(new String(batch, (int) keysAt + key, keyOffsets.get(row + 1) - key, StandardCharsets.UTF_8))
          .value(Arrays.copyOfRange(batch, payloadsAt + payload, payloadsAt + payloadOffsets.get(row + 1)))
          .sendAsync());
    }
    try {
      producer.flush();
      CompletableFuture.allOf(pending.toArray(new CompletableFuture<?>[0])).join();
    } catch (PulsarClientException | CompletionException e) {
      long failed = pending.stream().filter(CompletableFuture::isCompletedExceptionally).count();
      Throwable cause = e instanceof CompletionException && e.getCause() != null ? e.getCause() : e;
      throw new IllegalStateException("sending to topic '" + producer.getTopic() + "' failed: " + cause
          + " (" + failed + " messages)", cause);
    }
    return pending.size();
  }

  /** Closes the producer (its pending messages are flushed) and the client. */
  @Override
  public void close() throws PulsarClientException {
    try {
      producer.close();
    } finally {
      client.close();
    }
  }
}
