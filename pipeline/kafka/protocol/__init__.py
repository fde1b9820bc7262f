"""Kafka protocol messages that kafka-python 3.0 does not define, as schemas its own machinery reads
(pipeline/kafka/kafka_python.py: `consumer_group_describe`). Written for this project from the protocol's definition
(KIP-848's ConsumerGroupDescribe, API key 69, version 0)."""
