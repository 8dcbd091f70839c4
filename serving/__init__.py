"""Serving: every checkpoint the engine writes is guarded, published and made live (docs/serving.md).

The daemon calls :func:`build_publisher` once and submits each checkpoint to it once the step that
wrote it is committed; the ``alma versions`` and ``alma rollback`` commands use
:func:`make_publisher` directly.

Imports happen inside the factories: TorchServe workers import this package (through
:mod:`serving.handler`) and must not pay for the publisher's dependencies at every start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alma_daemon.config import Config
    from serving.background import BackgroundPublisher
    from serving.publisher import Publisher


def make_publisher(config: Config) -> Publisher | None:
    """The synchronous publisher for ``serving.kind`` over ``daemon.checkpoint_dir`` (None for ``none``)."""
    from alma_daemon.core.checkpoints import CheckpointStore

    store = CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name)
    if config.serving.kind == "local":
        from serving.local_publisher import LocalPublisher

        return LocalPublisher(
            store,
            config.serving.promotion_margin,
            promotion_alpha=config.serving.promotion_alpha,
            promotion_min_examples=config.serving.promotion_min_examples,
            promotion_min_positives=config.serving.promotion_min_positives,
            guard_positive_recall=config.serving.guard_positive_recall,
            keep_checkpoints=config.daemon.keep_checkpoints,
        )
    if config.serving.kind == "torchserve":
        from serving.torchserve_keys import TokenKeys, key_file_path
        from serving.torchserve_publisher import TorchServeClient, TorchServePublisher

        key_file = key_file_path(config)
        client = TorchServeClient(
            config.serving.management_url,
            config.serving.inference_url,
            TokenKeys(key_file) if key_file is not None else None,
        )
        return TorchServePublisher(store, config.serving, client, config.daemon.keep_checkpoints)
    return None


def build_publisher(config: Config) -> BackgroundPublisher | None:
    """The worker that publishes each version submitted to it in the background (the daemon submits
    through :class:`alma_daemon.service.publish_handoff.PublishHandoff`); call ``start()`` and, at
    shutdown, ``close()`` on it. None when ``serving.kind`` is ``none``."""
    from serving.background import BackgroundPublisher

    publisher = make_publisher(config)
    return BackgroundPublisher(publisher) if publisher is not None else None
