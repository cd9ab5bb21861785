package statefulstreams.flinkpeer;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Optional;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.typeinfo.TypeHint;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.pulsar.source.PulsarSource;
import org.apache.flink.connector.pulsar.source.enumerator.cursor.StartCursor;
import org.apache.flink.contrib.streaming.state.EmbeddedRocksDBStateBackend;
import org.apache.flink.streaming.api.CheckpointingMode;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.SingleOutputStreamOperator;
import org.apache.flink.streaming.api.environment.CheckpointConfig;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * The Flink peer of our enrichment job (bench/peers/flink/README.md), run in a local
 * MiniCluster by {@code java -jar}: every port on 127.0.0.1.
 *
 * <pre>
 * users  ─> parse ─┐ (keyed by user id)   items ─> parse ─┐ (keyed by item id)
 * orders ─> parse ─┴─> user lookup ───────────────────────┴─> item lookup ─> route ─> enriched/
 *             └─> dead letters (side output)                                  └──> missing_state/ (side output, reason)
 * </pre>
 *
 * State (the latest user and item per id, and the orders waiting for them) is keyed state in
 * RocksDB (EmbeddedRocksDBStateBackend, incremental checkpoints). Checkpoints every
 * {@code --checkpoint-interval-ms} are retained; {@code --restore true} starts from the newest
 * one, with the sources at the positions it holds. The sinks are at-least-once
 * ({@link JsonLinesSink}).
 */
public final class EnrichmentJob {
    private EnrichmentJob() {}

    public static void main(String[] argv) throws Exception {
        JobOptions options = JobOptions.parse(argv);
        StreamExecutionEnvironment env =
                StreamExecutionEnvironment.createLocalEnvironment(options.parallelism, configuration(options));
        env.setStateBackend(new EmbeddedRocksDBStateBackend(true));
        env.enableCheckpointing(options.checkpointIntervalMs, CheckpointingMode.EXACTLY_ONCE);
        CheckpointConfig checkpoints = env.getCheckpointConfig();
        checkpoints.setCheckpointStorage(Paths.get(options.checkpointsDir).toUri().toString());
        checkpoints.setExternalizedCheckpointCleanup(CheckpointConfig.ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION);
        checkpoints.setMinPauseBetweenCheckpoints(options.checkpointIntervalMs / 2);
        build(env, options);
        env.execute("stateful-streams flink peer");
    }

    /** The MiniCluster's settings: loopback only, a fixed REST port, the restore path. */
    static Configuration configuration(JobOptions options) throws java.io.IOException {
        Configuration conf = new Configuration();
        conf.setString("rest.bind-address", "127.0.0.1");
        conf.setString("rest.address", "127.0.0.1");
        conf.setString("rest.port", Integer.toString(options.restPort));
        conf.setString("jobmanager.bind-host", "127.0.0.1");
        conf.setString("jobmanager.rpc.address", "127.0.0.1");
        conf.setString("taskmanager.bind-host", "127.0.0.1");
        conf.setString("taskmanager.host", "127.0.0.1");
        conf.setString("taskmanager.memory.managed.size", options.managedMemory);
        conf.setString("restart-strategy.type", "fixed-delay");
        conf.setString("restart-strategy.fixed-delay.attempts", "5");
        conf.setString("restart-strategy.fixed-delay.delay", "10 s");
        conf.setString("state.checkpoints.num-retained", "2");
        if (options.restore) {
            Optional<Path> newest = Checkpoints.newestCompleted(options.checkpointsDir);
            if (newest.isPresent()) {
                conf.setString("execution.savepoint.path", newest.get().toUri().toString());
                System.err.println("restoring from " + newest.get());
            } else {
                System.err.println("no completed checkpoint under " + options.checkpointsDir + "; starting empty");
            }
        }
        return conf;
    }

    /** The job graph: sources, parse, the two lookups, routing, and the three sinks. */
    static void build(StreamExecutionEnvironment env, JobOptions options) {
        SingleOutputStreamOperator<Change<User>> users = read(env, options, options.usersTopic, "users")
                .process(new ParseMessages<Change<User>>(ParseMessages.Topic.USERS, options.usersTopic))
                .returns(new TypeHint<Change<User>>() {}).name("parse users").uid("parse-users");
        SingleOutputStreamOperator<Change<Item>> items = read(env, options, options.itemsTopic, "items")
                .process(new ParseMessages<Change<Item>>(ParseMessages.Topic.ITEMS, options.itemsTopic))
                .returns(new TypeHint<Change<Item>>() {}).name("parse items").uid("parse-items");
        SingleOutputStreamOperator<PendingOrder> orders = read(env, options, options.ordersTopic, "orders")
                .process(new ParseMessages<PendingOrder>(ParseMessages.Topic.ORDERS, options.ordersTopic))
                .returns(PendingOrder.class).name("parse orders").uid("parse-orders");

        // {"order": {...}, "user": {...} or null, "item": null, "firstSeenMs": ...}
        DataStream<PendingOrder> withUser = orders.keyBy(pending -> pending.order.userId)
                .connect(users.keyBy(change -> change.id))
                .process(new LookupFunction<User>(Lookup.USER, options.maxWaitMs), TypeInformation.of(PendingOrder.class))
                .name("user lookup").uid("user-lookup");
        // {"order": {...}, "user": {...} or null, "item": {...} or null, ...}
        DataStream<PendingOrder> withItem = withUser.keyBy(pending -> pending.order.itemId)
                .connect(items.keyBy(change -> change.id))
                .process(new LookupFunction<Item>(Lookup.ITEM, options.maxWaitMs), TypeInformation.of(PendingOrder.class))
                .name("item lookup").uid("item-lookup");
        SingleOutputStreamOperator<EnrichedOrder> enriched = withItem
                .process(new RouteOutcome(options.ordersTopic)).name("route").uid("route");

        String sinks = options.sinksDir;
        enriched.sinkTo(new JsonLinesSink<>(sinks + "/enriched", options.flushMs)).name("enriched").uid("sink-enriched");
        enriched.getSideOutput(RouteOutcome.MISSING_STATE)
                .sinkTo(new JsonLinesSink<>(sinks + "/missing_state", options.flushMs))
                .name("missing_state").uid("sink-missing-state");
        users.getSideOutput(ParseMessages.DEAD_LETTERS)
                .union(items.getSideOutput(ParseMessages.DEAD_LETTERS), orders.getSideOutput(ParseMessages.DEAD_LETTERS))
                .sinkTo(new JsonLinesSink<>(sinks + "/dead_letter", options.flushMs)).setParallelism(1)
                .name("dead_letter").uid("sink-dead-letter");
    }

    /** One topic from its earliest message, one split per partition, with Flink's Pulsar source. */
    private static DataStream<PulsarMessage> read(StreamExecutionEnvironment env, JobOptions options, String topic,
                                                  String name) {
        PulsarSource<PulsarMessage> source = PulsarSource.builder()
                .setServiceUrl(options.serviceUrl)
                .setTopics(topic)
                .setStartCursor(StartCursor.earliest())
                .setSubscriptionName(options.subscription + "-" + name)
                .setConsumerName(options.subscription + "-" + name)
                .setDeserializationSchema(new PulsarMessageSchema())
                .build();
        return env.fromSource(source, WatermarkStrategy.noWatermarks(), "pulsar " + name)
                .uid("source-" + name).setParallelism(1);
    }
}
