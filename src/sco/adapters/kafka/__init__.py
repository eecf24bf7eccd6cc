"""The event log on Kafka through confluent-kafka: a topic per region, keyed by pool."""
