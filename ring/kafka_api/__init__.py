"""Kafka's binary protocol as one more client front (``ring serve --kafka-listen``): the listener
(server), the APIs served (apis: cluster for Metadata, produce, consume for Fetch, offsets for
ListOffsets), the wire primitives (wire), RecordBatch v2 (records) and Kafka's error codes (errors)."""
