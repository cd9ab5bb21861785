package statefulstreams.flinkpeer;

/** A message no rule could use, with the one-line reason (the dead_letter sink's row). */
public class DeadLetter {
    public String sourceTopic;
    public String sourceMessageId;
    public String key;
    public String payload;
    public String error;
    public long publishedAt;
    public long detectedAt;

    public DeadLetter() {}
}
