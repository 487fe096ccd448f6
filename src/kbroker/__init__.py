"""kbroker: an Apache Kafka-compatible message broker with a Cython hot path."""

__version__ = "0.1.0"
