"""The Kafka transport: :class:`KafkaPublisher` sends wire records to a topic, :class:`KafkaSource`
reads them back, positioned by offsets stored in Redis.

The consumer uses ``assign()`` + ``seek()`` and no consumer group: the offsets that count are the
ones written to Redis together with the data (docs/architecture.md: a group join against Tansu
waits about half the session timeout, and committing offsets to Kafka separately from the data
would break exactly-once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import (
    BrokerNotAvailableError,
    CorruptRecordError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    LogTruncationError,
    NodeNotReadyError,
    NoError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    for_code,
)

from alma_daemon import metrics
from alma_daemon.data.wire import WireRecord
from alma_daemon.infra.connections import kafka_client, kafka_security
from alma_daemon.infra.unreachable import ServerUnreachable
from alma_daemon.transports.source import SourceRecord

if TYPE_CHECKING:
    from alma_daemon.config import Config

log = logging.getLogger(__name__)

#: Fetch sizes: parts are up to ~900 KiB, so Kafka's 1 MiB per-partition default would fetch one
#: record per round trip. These bound the consumer's memory to a few tens of MiB.
CONSUMER_SETTINGS: dict[str, Any] = {
    "max_partition_fetch_bytes": 8 << 20,
    "fetch_max_bytes": 32 << 20,
    "fetch_max_wait_ms": 100,
    # kafka-python's default ("latest") moves a partition whose stored offset the broker no longer
    # holds to the log end, skipping every retained record unread and saying so only at INFO:
    # KafkaSource.poll handles what the policy would (docs/service.md).
    "auto_offset_reset": "none",
}


#: How long the lag query, which doubles as the broker's health probe, waits for an answer.
LAG_TIMEOUT_MS = 2000


class TopicNotServed(KafkaError):
    """The broker answered about the awaited topic with a retriable error other than "no such topic
    yet" (a controller moving, a request timing out broker-side): an outage, retried like one."""

    retriable = True


#: Topic errors that mean the topic is not there yet, so ingest waits for it.
TOPIC_NOT_YET = (UnknownTopicOrPartitionError, LeaderNotAvailableError)


def partitions_of(described: Mapping[str, Any], topic: str) -> list[int]:
    """The partition numbers of one topic of a ``describe_topics`` answer (kafka-python 3 field
    names); empty while the topic is not there yet. Raises :class:`TopicNotServed` for another
    retriable error, and the error itself, naming ``kafka.topic``, for one that retrying cannot cure
    (no permission to describe it)."""
    error = for_code(described["error_code"])
    if error is NoError:
        return sorted(p["partition_index"] for p in described["partitions"])
    if error in TOPIC_NOT_YET:
        return []
    if error.retriable:
        raise TopicNotServed(f"Kafka topic {topic!r}: {error.__name__}")
    raise error(f"Kafka topic {topic!r} (kafka.topic)")


#: How long one ask for the topic's partitions waits for an answer (a frozen broker's connection
#: setup still takes kafka-python's 10 s).
DISCOVERY_TIMEOUT_MS = 2000
#: Seconds between two asks for the broker or the topic while either is missing.
DISCOVERY_INTERVAL = 1.0
#: How long building a client waits for the broker's first answer (kafka-python's default: 30 s).
BOOTSTRAP_TIMEOUT_MS = 5000


class KafkaSource:
    """Every partition of one topic, read from the offsets the caller stores; ``security`` holds the
    TLS and SASL keywords of ``connections.kafka_security``.

    Nothing connects at construction: the first polls build the clients, so a daemon started before
    its broker runs and reports Kafka down meanwhile. Until the topic exists, an admin client asks
    for it with bounded requests that never create it: the consumer's ``partitions_for_topic`` has
    no time limit (tens of seconds per call while the broker is down, growing with the reconnect
    backoff), and its ``end_offsets`` (ListOffsets) makes Tansu create a missing topic despite
    ``allow_auto_create_topics=False``. The partitions are read once: partitions added to the topic
    later are read from their start after a restart.
    """

    server = "kafka"
    #: What kafka-python raises while no broker answers (it reconnects by itself meanwhile).
    unreachable: tuple[type[BaseException], ...] = (
        KafkaTimeoutError,
        KafkaConnectionError,
        BrokerNotAvailableError,
        NodeNotReadyError,
        RequestTimedOutError,
        TopicNotServed,
    )

    def __init__(self, bootstrap_servers: str, topic: str, security: Mapping[str, Any] | None = None):
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.security = dict(security or {})
        #: Built once a broker accepts connections (:meth:`_connect`): a daemon may start before its broker.
        self.consumer: KafkaConsumer | None = None
        self._admin: KafkaAdminClient | None = None
        self.partitions: list[TopicPartition] = []
        self._offsets: dict[str, str] = {}
        self._next_discovery = 0.0
        #: What the last ask for the broker or the topic met while no broker answered; :meth:`lag` reports it.
        self._discovery_error: BaseException | None = None

    @classmethod
    def from_config(cls, config: Config, client: Any) -> KafkaSource:
        """The topic ``kafka.topic`` on ``kafka.bootstrap_servers`` (``client``, the daemon's Redis, unused)."""
        return cls(config.kafka.bootstrap_servers, config.kafka.topic, kafka_security(config.kafka))

    def _connect(self) -> None:
        """Build the consumer and the admin client; raises an outage while no broker accepts
        connections (tried once every ``DISCOVERY_INTERVAL`` seconds at most)."""
        consumer = kafka_client(
            KafkaConsumer,
            self.bootstrap_servers,
            self.security,
            group_id=None,
            enable_auto_commit=False,
            allow_auto_create_topics=False,
            client_id="alma-ingest",
            bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS,
            **CONSUMER_SETTINGS,
        )
        try:
            self._admin = kafka_client(
                KafkaAdminClient,
                self.bootstrap_servers,
                self.security,
                client_id="alma-ingest-discovery",
                request_timeout_ms=DISCOVERY_TIMEOUT_MS,
                bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS,
            )
        except BaseException:
            consumer.close()
            raise
        self.consumer = consumer

    def seek(self, offsets: dict[str, str]) -> None:
        self._offsets = dict(offsets)
        if self.partitions:
            self._position_all()

    def _discover(self) -> bool:
        """Assign the topic's partitions once it exists (the daemon may start before the producer)."""
        if self.partitions:
            return True
        now = time.monotonic()
        if now < self._next_discovery:
            return False
        self._next_discovery = now + DISCOVERY_INTERVAL
        try:
            if self.consumer is None:
                self._connect()
            found = self._topic_partitions()
        except self.unreachable as exc:
            # Like the consumer's poll while the broker is down: nothing now, reported by lag().
            self._discovery_error = exc
            return False
        self._discovery_error = None
        if not found:
            log.info("waiting for topic", extra={"topic": self.topic})
            return False
        self._close_admin()
        assert self.consumer is not None  # connected above
        self.partitions = [TopicPartition(self.topic, p) for p in found]
        self.consumer.assign(self.partitions)
        self._position_all()
        return True

    def _topic_partitions(self) -> list[int]:
        """The topic's partition numbers, empty while it does not exist (its Metadata request says
        ``allow_auto_topic_creation=False``, so asking never creates it)."""
        assert self._admin is not None  # closed only once the partitions are known
        (described,) = self._admin.describe_topics([self.topic])
        return partitions_of(described, self.topic)

    def _position_all(self) -> None:
        assert self.consumer is not None  # partitions are assigned only once connected
        for tp in self.partitions:
            stored = self._offsets.get(str(tp.partition))
            if stored is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, int(stored))

    def poll(self, timeout: float, max_records: int) -> list[SourceRecord]:
        if not self._discover():
            time.sleep(min(timeout, 0.2))
            return []
        assert self.consumer is not None  # discovered, hence connected
        try:
            batches = self.consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        except CorruptRecordError as exc:
            return [self._skip_unreadable(exc)]
        except OffsetOutOfRangeError as exc:
            # Retention deleted the stored offset, or the topic was made again.
            for tp, offset in exc.args[0].items():
                self._continue_at(tp, None, "stored offset out of range", offset)
            return []
        except LogTruncationError as exc:
            # An unclean leader election dropped records already read: continue where the logs part,
            # as kafka-python does under a reset policy.
            for tp, divergent in exc.divergent_offsets.items():
                self._continue_at(tp, None if divergent is None else divergent.offset, "log truncated")
            return []
        return [
            SourceRecord(
                str(tp.partition),
                str(r.offset + 1),
                r.key,
                r.value,
                list(r.headers or []),
                f"{self.topic}/{tp.partition}@{r.offset}",
            )
            for tp, records in batches.items()
            for r in records
        ]

    def _skip_unreadable(self, exc: CorruptRecordError) -> SourceRecord:
        """The record kafka-python cannot parse, as a record to dead-letter, with the consumer moved past it.

        kafka-python's error names neither partition nor offset (a header name that is not UTF-8
        reads as "Found invalid record structure: UnicodeDecodeError(...)"), and its next poll would
        spin for ever on the records it failed on. Those records are the fetcher's in-line ones,
        whose partition is read from kafka-python 3.0's private state: nothing public tells which
        partition failed; their next offset is the failed record's, as the position is. Its parser
        stops at the first bad record of a record batch, so the batch's later records come back
        here one at a time as well.
        """
        assert self.consumer is not None  # polled, hence connected
        failed = self.consumer._fetcher._next_partition_records
        tp, offset = failed.topic_partition, failed.next_fetch_offset
        self.consumer.seek(tp, offset + 1)
        return SourceRecord(
            str(tp.partition),
            str(offset + 1),
            None,
            None,
            None,
            f"{self.topic}/{tp.partition}@{offset}",
            f"kafka-python cannot read this record or an earlier one of its record batch: {exc}",
        )

    def _continue_at(self, tp: TopicPartition, offset: int | None, why: str, lost: int | None = None) -> None:
        """Continue ``tp``, whose position the broker no longer holds, at ``offset`` or, when that is
        None, at its earliest retained record; logged and counted, as unread records may be gone."""
        assert self.consumer is not None  # polled, hence connected
        log.warning(
            "Kafka no longer holds the partition's position: continuing elsewhere",
            extra={
                "reason": why,
                "topic": self.topic,
                "partition": tp.partition,
                "offset": lost,
                "continue_at": "earliest" if offset is None else offset,
            },
        )
        metrics.KAFKA_OFFSET_RESETS.inc()
        if offset is None:
            self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek(tp, offset)

    def acknowledge(self, offsets: dict[str, str]) -> None:
        """Kafka keeps records by its retention settings; nothing to drop here."""

    def lag(self) -> int | None:
        if not self.partitions:
            if self._discovery_error is not None:
                raise self._discovery_error.with_traceback(None)
            return None
        assert self.consumer is not None  # partitions are assigned only once connected
        positions = {tp: self._position(tp) for tp in self.partitions}
        ends = self.consumer.end_offsets(self.partitions, timeout_ms=LAG_TIMEOUT_MS)
        return sum(max(0, ends[tp] - positions[tp]) for tp in self.partitions)

    def _position(self, tp: TopicPartition) -> int:
        """The next offset to read. While a reset (``seek_to_beginning``) gets no answer, position()
        without a time limit waits kafka-python's request timeout (30 s) and then returns None."""
        assert self.consumer is not None  # partitions are assigned only once connected
        position: int | None = self.consumer.position(tp, timeout_ms=LAG_TIMEOUT_MS)
        if position is None:
            raise KafkaTimeoutError(f"{self.topic}/{tp.partition}: no position within {LAG_TIMEOUT_MS} ms")
        return position

    def close(self) -> None:
        self._close_admin()
        if self.consumer is not None:
            self.consumer.close()

    def _close_admin(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


class KafkaPublisher:
    """Publishes to a Kafka topic (created with ``partitions`` partitions if it does not exist);
    ``security`` holds the TLS and SASL keywords of ``connections.kafka_security``.

    With no broker to publish to, construction fails at once with one line saying what to do
    (:class:`~alma_daemon.infra.unreachable.ServerUnreachable`).
    """

    def __init__(
        self, bootstrap_servers: str, topic: str, partitions: int = 1, security: Mapping[str, Any] | None = None
    ):
        from kafka import KafkaProducer

        self.topic = topic
        try:
            ensure_topic(bootstrap_servers, topic, partitions, security)
        except KafkaConnectionError as exc:
            raise ServerUnreachable("kafka", bootstrap_servers, exc) from exc
        self.producer = kafka_client(
            KafkaProducer, bootstrap_servers, security or {}, acks="all", linger_ms=5, client_id="alma-replay"
        )
        self._futures: list[Any] = []

    def send(self, records: list[WireRecord]) -> None:
        for record in records:
            self._futures.append(
                self.producer.send(self.topic, key=record.key, value=record.value, headers=record.headers)
            )
        self._raise_failures()

    def _raise_failures(self) -> None:
        done = [f for f in self._futures if f.is_done]
        for future in done:
            if future.failed():
                raise RuntimeError(f"publishing to {self.topic} failed: {future.exception}")
        self._futures = [f for f in self._futures if not f.is_done]

    def close(self) -> None:
        self.producer.flush()
        self._raise_failures()
        self.producer.close()


def ensure_topic(
    bootstrap_servers: str, topic: str, partitions: int, security: Mapping[str, Any] | None = None
) -> None:
    """Create ``topic`` with ``partitions`` partitions unless it exists or the broker does not let us."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import AuthorizationError, TopicAlreadyExistsError

    admin = kafka_client(KafkaAdminClient, bootstrap_servers, security or {}, client_id="alma-replay-admin")
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
        log.info("topic created", extra={"topic": topic, "partitions": partitions})
    except TopicAlreadyExistsError:
        pass
    except AuthorizationError:
        # Managed clusters usually let a producer write to a topic, not create one: it was made beforehand.
        log.info("not allowed to create topics; publishing to an existing one", extra={"topic": topic})
    finally:
        admin.close()
