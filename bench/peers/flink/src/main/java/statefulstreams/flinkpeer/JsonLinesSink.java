package statefulstreams.flinkpeer;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.PropertyNamingStrategies;
import java.io.BufferedOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import org.apache.flink.api.common.operators.ProcessingTimeService;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;

/**
 * Rows as JSON lines (snake_case names) in {@code <dir>/part-<subtask>-<start ms>.jsonl}, one
 * file per writer and start: a restarted job writes new files beside the old ones.
 *
 * <p>Delivery is <b>at-least-once</b>, not exactly-once: lines are flushed to the file every
 * {@code flushMs} and at every checkpoint barrier (so a completed checkpoint covers every line
 * before it), but rows written after the last completed checkpoint are written again when the
 * job restarts from it. (Flink's FileSink would give exactly-once by committing files only on
 * checkpoints, at the cost of a checkpoint interval of latency.)
 */
public class JsonLinesSink<T> implements Sink<T> {
    private static final long serialVersionUID = 1L;
    private final String dir;
    private final long flushMs;

    public JsonLinesSink(String dir, long flushMs) {
        this.dir = dir;
        this.flushMs = flushMs;
    }

    @Override
    public SinkWriter<T> createWriter(InitContext context) throws IOException {
        Path folder = Paths.get(dir);
        Files.createDirectories(folder);
        Path file = folder.resolve("part-" + context.getSubtaskId() + "-" + System.currentTimeMillis() + ".jsonl");
        return new Writer<>(file, context.getProcessingTimeService(), flushMs);
    }

    /** Called on the task's thread only: writes, timer flushes and barrier flushes never overlap. */
    private static final class Writer<T> implements SinkWriter<T> {
        private final FileOutputStream file;
        private final BufferedOutputStream out;
        private final ObjectMapper mapper = new ObjectMapper()
                .setPropertyNamingStrategy(PropertyNamingStrategies.SNAKE_CASE);
        private final ProcessingTimeService timers;
        private final long flushMs;
        private boolean dirty;
        private boolean closed;

        Writer(Path path, ProcessingTimeService timers, long flushMs) throws IOException {
            this.file = new FileOutputStream(path.toFile(), true);
            this.out = new BufferedOutputStream(file, 1 << 16);
            this.timers = timers;
            this.flushMs = flushMs;
            schedule();
        }

        private void schedule() {
            timers.registerTimer(timers.getCurrentProcessingTime() + flushMs, now -> {
                if (!closed) {
                    if (dirty) {
                        out.flush();
                        dirty = false;
                    }
                    schedule();
                }
            });
        }

        @Override
        public void write(T element, Context context) throws IOException {
            out.write(mapper.writeValueAsBytes(element));
            out.write('\n');
            dirty = true;
        }

        @Override
        public void flush(boolean endOfInput) throws IOException {
            out.flush();
            file.getFD().sync();
            dirty = false;
        }

        @Override
        public void close() throws IOException {
            closed = true;
            out.close();
        }
    }
}
