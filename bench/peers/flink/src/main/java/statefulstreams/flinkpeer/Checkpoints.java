package statefulstreams.flinkpeer;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Comparator;
import java.util.Optional;
import java.util.stream.Stream;

/**
 * Finds the newest completed checkpoint under the checkpoint folder, to restart from after a
 * crash: what a Flink cluster's HA services do for a job, done here because the MiniCluster
 * of a {@code java -jar} has none. A checkpoint is complete once its {@code _metadata} exists.
 */
final class Checkpoints {
    private Checkpoints() {}

    static Optional<Path> newestCompleted(String checkpointsDir) throws IOException {
        Path root = Paths.get(checkpointsDir);
        if (!Files.isDirectory(root)) {
            return Optional.empty();
        }
        try (Stream<Path> found = Files.find(root, 2, (path, attrs) -> attrs.isDirectory()
                && path.getFileName().toString().startsWith("chk-") && Files.exists(path.resolve("_metadata")))) {
            return found.max(Comparator.comparingLong(Checkpoints::modified));
        }
    }

    private static long modified(Path checkpoint) {
        try {
            return Files.getLastModifiedTime(checkpoint.resolve("_metadata")).toMillis();
        } catch (IOException gone) {
            return Long.MIN_VALUE;
        }
    }
}
