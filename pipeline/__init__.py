"""Stateful Streams: the Spark job and everything that feeds it (broker, producers, source, sinks)."""
