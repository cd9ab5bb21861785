package statefulstreams.flinkpeer;

import java.io.Serializable;
import org.apache.flink.api.java.utils.ParameterTool;

/**
 * The peer's settings, from {@code --name value} arguments, read once in {@code main}. Each
 * mirrors one of our job's settings where it has one (DESIGN.md §8).
 */
public final class JobOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    final String serviceUrl;      // pulsar.service_url
    final String usersTopic;      // topics.users
    final String itemsTopic;      // topics.items
    final String ordersTopic;     // topics.orders
    final String subscription;    // the prefix of the source subscriptions
    final String sinksDir;        // <sinks>/{enriched,missing_state,dead_letter}/
    final String checkpointsDir;  // retained checkpoints, <dir>/<job id>/chk-<n>/
    final long maxWaitMs;         // enrichment.max_wait
    final long checkpointIntervalMs;
    final long flushMs;           // how often the sinks flush their buffers
    final int parallelism;
    final int restPort;           // Flink's REST API on 127.0.0.1 (metrics); 0 picks a free port
    final boolean restore;        // start from the newest retained checkpoint, if there is one
    final String managedMemory;   // the task manager's managed memory (RocksDB's caches)

    private JobOptions(ParameterTool args) {
        serviceUrl = args.getRequired("service-url");

        usersTopic = args.get("users-topic", "persistent://public/default/users");
        itemsTopic = args.get("items-topic", "persistent://public/default/items");
        ordersTopic = args.get("orders-topic", "persistent://public/default/orders");
        subscription = args.get("subscription", "flink-peer");
        sinksDir = args.getRequired("sinks");
        checkpointsDir = args.getRequired("checkpoints");
        maxWaitMs = args.getLong("max-wait-ms", 10_000);
        checkpointIntervalMs = args.getLong("checkpoint-interval-ms", 1_000);
        flushMs = args.getLong("flush-ms", 50);
        parallelism = args.getInt("parallelism", 2);
        restPort = args.getInt("rest-port", 0);
        restore = args.getBoolean("restore", false);
        managedMemory = args.get("managed-memory", "256m");
        if (maxWaitMs < 0 || checkpointIntervalMs < 10 || flushMs < 1 || parallelism < 1) {
            throw new IllegalArgumentException("--max-wait-ms must be >= 0, --checkpoint-interval-ms >= 10, "
                    + "--flush-ms >= 1 and --parallelism >= 1; got " + maxWaitMs + ", " + checkpointIntervalMs
                    + ", " + flushMs + ", " + parallelism);
        }
    }

    static JobOptions parse(String[] argv) {
        return new JobOptions(ParameterTool.fromArgs(argv));
    }
}
