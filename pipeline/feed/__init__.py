"""What feeds the job: the brokers (pulsar-lite, Apache Pulsar), topic set-up, producers and sample data."""
