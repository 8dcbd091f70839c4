"""Publishing: every checkpoint the engine writes is guarded, published and made live (docs/serving.md).

The daemon's side of serving: the publisher's flow (:mod:`.publisher`) and its registry here, one module
per publisher (``serving.kind``: :mod:`.local`, :mod:`.torchserve`, :mod:`.oip` for kserve,
:mod:`.triton`), the worker that runs it (:mod:`.background`), the promotion guard (:mod:`.guard`,
:mod:`.paired_tests`), and what is on disk (:mod:`.live_pointer`, :mod:`.archiver`, :mod:`.retention`).

The daemon calls :func:`build_publisher` once and submits each checkpoint to it once the step that
wrote it is committed; the ``alma versions`` and ``alma rollback`` commands use
:func:`make_publisher` directly.

Imports happen inside the factories: only the module of the chosen ``serving.kind`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alma_daemon.config import Config
    from alma_daemon.core.checkpoints import CheckpointStore
    from serving.publishing.background import BackgroundPublisher
    from serving.publishing.publisher import Publisher


def make_publisher(config: Config) -> Publisher | None:
    """The synchronous publisher for ``serving.kind`` over ``daemon.checkpoint_dir`` (None for ``none``)."""
    from alma_daemon.core.checkpoints import CheckpointStore

    kind = config.serving.kind
    if kind == "none":
        return None
    if kind not in PUBLISHERS:  # a kind added to ServingConfig.kind alone would otherwise publish nothing
        raise KeyError(f"serving.kind {kind!r} has no publisher; known: {', '.join(sorted(PUBLISHERS))}, none")
    factory = PUBLISHERS[kind]
    return factory(config, CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name))


def _local(config: Config, store: CheckpointStore) -> Publisher:
    from serving.publishing.local import LocalPublisher
    from serving.publishing.publisher import guard_settings

    serving = config.serving
    return LocalPublisher(
        store,
        serving.promotion_margin,
        **guard_settings(serving),
        keep_checkpoints=config.daemon.keep_checkpoints,
    )


def _torchserve(config: Config, store: CheckpointStore) -> Publisher:
    from serving.protocols.torchserve_keys import TokenKeys, key_file_path
    from serving.publishing.torchserve import TorchServeClient, TorchServePublisher

    key_file = key_file_path(config)
    client = TorchServeClient(
        config.serving.management_url,
        config.serving.inference_url,
        TokenKeys(key_file) if key_file is not None else None,
    )
    return TorchServePublisher(store, config.serving, client, config.daemon.keep_checkpoints)


def _kserve(config: Config, store: CheckpointStore) -> Publisher:
    from serving.protocols.repository_token import RepositoryToken, check_token
    from serving.publishing.oip import OipClient, OipPublisher

    check_token(config)  # a token file that cannot be read: one line at the start, not at the first swap
    client = OipClient(config.serving.inference_url, RepositoryToken.for_config(config))
    return OipPublisher(store, config.serving, client, config.daemon.keep_checkpoints)


def _triton(config: Config, store: CheckpointStore) -> Publisher:
    from serving.protocols.triton_token import TritonToken, check_token
    from serving.publishing.oip import OipClient
    from serving.publishing.triton import TritonPublisher

    check_token(config)
    client = OipClient(config.serving.inference_url, TritonToken.for_config(config))
    return TritonPublisher(store, config.serving, client, config.daemon.keep_checkpoints)


#: ``serving.kind`` -> the publisher's factory (``none`` has none).
PUBLISHERS: dict[str, Callable[[Config, CheckpointStore], Publisher]] = {
    "local": _local,
    "torchserve": _torchserve,
    "kserve": _kserve,
    "triton": _triton,
}


def build_publisher(config: Config) -> BackgroundPublisher | None:
    """The worker that publishes each version submitted to it in the background (the daemon submits
    through :class:`alma_daemon.service.publish_handoff.PublishHandoff`); call ``start()`` and, at
    shutdown, ``close()`` on it. None when ``serving.kind`` is ``none``."""
    from serving.publishing.background import BackgroundPublisher

    publisher = make_publisher(config)
    return BackgroundPublisher(publisher) if publisher is not None else None
