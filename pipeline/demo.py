"""`make demo`: a transactional round trip against the local broker, printed step by step."""

from __future__ import annotations

import os
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.offsets import TailReader, high_watermarks, read_to_end


def main() -> None:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    topic = f"demo-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    print(f"created topic {topic} on {bootstrap}")

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"demo-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    print("transaction 1: wrote 'committed', committed")
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush()
    producer.abort_transaction(30)
    print("transaction 2: wrote 'aborted', aborted")

    for isolation in ("read_uncommitted", "read_committed"):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo", "isolation.level": isolation})
        ends = high_watermarks(admin, topic, [0], 10)
        values = [m.value().decode() for m in read_to_end(TailReader(consumer, topic, {0: 0}, ends), 20)]
        consumer.close()
        print(f"{isolation:>16} reader sees {values} (high watermark {ends[0]}: markers occupy offsets too)")


if __name__ == "__main__":
    main()
