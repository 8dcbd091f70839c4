"""The wire format's names and limits: headers, content types, rejection reasons, stream names, ids.

The codecs (:mod:`alma_daemon.data.wire` for chunk parts, :mod:`alma_daemon.data.events` for events)
import torch; these names do not, so the command line (``alma replay``'s options), the metrics
(one counter per rejection reason) and the Redis keyspace read them without loading it.
"""

from __future__ import annotations

import re

SCHEMA_VERSION = 1
CONTENT_TYPE = "application/vnd.alma.safetensors"
# Kafka's default message.max.bytes is 1 MiB for the whole batch; 900 KiB leaves room for the
# key, the headers and the record-batch framing.
DEFAULT_MAX_PART_BYTES = 900 * 1024

HEADER_SCHEMA = "alma-schema"
HEADER_STREAM = "alma-stream"
HEADER_CHUNK = "alma-chunk"
HEADER_PART = "alma-part"
HEADER_PARTS = "alma-parts"
HEADER_CONTENT_TYPE = "content-type"

#: Machine-readable rejection reasons, in a stable order so that metrics can pre-register every
#: label value (a counter that exists at 0 makes "no rejections" visible in Prometheus).
REJECT_REASONS: tuple[str, ...] = (
    "schema",
    "headers",
    "stream",
    "part_numbering",
    "size",
    "decode",
    "dtype",
    "shape",
    "label_range",
    "non_finite",
    "value_range",
    "chunk_order",
    "chunk_ahead",
    "fields",
    "incomplete",
)

#: Stream names end up inside the Redis hash tag ``{<stream>}`` and in the key ``<stream>/<chunk>``,
#: so braces, slashes, colons and whitespace are excluded.
STREAM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: Chunk ids and part counts score the Redis ``ready`` zset, whose scores are doubles: ids above
#: 2**53 - 1 would silently collide there.
MAX_ID = 2**53 - 1
#: How far ahead of the newest completed chunk a chunk id may be, by default
#: (the config's ``daemon.max_chunks_ahead``). Without a bound one record with a huge id completes,
#: and every later chunk of the stream is older than it.
DEFAULT_MAX_CHUNKS_AHEAD = 1000

#: The content types of event records (:mod:`alma_daemon.data.events`).
EVENT_JSON = "application/json"
EVENT_ROWS = "application/vnd.alma.rows+safetensors"
EVENT_CONTENT_TYPES = (EVENT_JSON, EVENT_ROWS)
