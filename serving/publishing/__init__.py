"""Publishing: every checkpoint the engine writes is guarded, published and made live (docs/serving.md).

The daemon's side of serving: the publisher's flow (:mod:`.publisher`) and its registry here, one module
per publisher (``serving.kind``: :mod:`.local`, :mod:`.torchserve`, :mod:`.oip` for kserve,
:mod:`.triton`), the worker that runs it (:mod:`.background`), the promotion guard (:mod:`.guard`,
:mod:`.paired_tests`), and what is on disk (:mod:`.live_pointer`, :mod:`.archiver`, :mod:`.retention`).

The daemon calls :func:`build_publisher` once and submits each checkpoint to it once the step that
wrote it is committed; the ``alma versions`` and ``alma rollback`` commands use
:func:`make_publisher` directly.

Only the module of the chosen ``serving.kind`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from alma_daemon.registry import PUBLISHERS as PUBLISHER_REGISTRY
from alma_daemon.registry import Registry

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
        raise KeyError(f"serving.kind {kind!r} has no publisher; known: {', '.join(PUBLISHERS)}, none")
    return PUBLISHERS[kind](config, CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name))


#: ``serving.kind`` -> the publisher's factory (``none`` has none), from the entry points of group
#: ``alma_daemon.publishers``: each names a publisher class's ``from_config``.
PUBLISHERS = cast("Registry[Callable[[Config, CheckpointStore], Publisher]]", PUBLISHER_REGISTRY)


def build_publisher(config: Config) -> BackgroundPublisher | None:
    """The worker that publishes each version submitted to it in the background (the daemon submits
    through :class:`alma_daemon.service.publish_handoff.PublishHandoff`); call ``start()`` and, at
    shutdown, ``close()`` on it. None when ``serving.kind`` is ``none``."""
    from serving.publishing.background import BackgroundPublisher

    publisher = make_publisher(config)
    return BackgroundPublisher(publisher) if publisher is not None else None
