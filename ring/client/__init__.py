"""ring's Python client: ``AsyncClient`` for asyncio code, ``Client`` for the rest.

    from ring.client import Client
    with Client("http://127.0.0.1:9250") as c:
        c.create_topic("clicks", partitions=8, exist_ok=True)
        c.produce("clicks", json={"page": "/"}, key="user-1")   # a future
        c.flush()
        print(c.fetch("clicks", 0, 0).records)

Records are batched per partition and sent straight to each partition's
leader; see ``ring.client.aio`` for batching, partitioning and retries.
Consumer groups: ``GroupConsumer`` / ``AsyncGroupConsumer`` (``ring.client.consumer``).
"""

from ring.client.aio import AsyncClient, Partitioner
from ring.client.batcher import BufferFull
from ring.client.consumer import AsyncGroupConsumer
from ring.client.records import ConsumerRecord, FetchResult, RecordMetadata
from ring.client.sync import Client, GroupConsumer
from ring.client.transport import BrokersUnavailable, BrokerUnreachable, ClientClosed, OutcomeUnknown

__all__ = [
    "AsyncClient",
    "AsyncGroupConsumer",
    "BrokerUnreachable",
    "BrokersUnavailable",
    "BufferFull",
    "Client",
    "ClientClosed",
    "ConsumerRecord",
    "FetchResult",
    "GroupConsumer",
    "OutcomeUnknown",
    "Partitioner",
    "RecordMetadata",
]
