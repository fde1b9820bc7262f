"""The Kafka sink: exactly-once from Kafka to Kafka, with the state's changelog and the offsets in the same transaction.

runner.py       KafkaRunner: the loop; builds, commits (`commit_transaction`) and aborts every transaction
task.py         KafkaTask: one input partition's records processed into the transaction it was given
transaction.py  Transaction: one transactional producer and the tasks whose work is open in it
takeover.py     taking partitions over: topics checked, the fence, the committed offsets
snapshot.py     the full snapshot published on a clean stop (SNAPSHOT_ON_SHUTDOWN)
"""
