"""The ``alma`` command line. Each subcommand lives in ``alma_daemon/commands/<name>.py``, named by an entry
point of group ``alma_daemon.commands`` (pyproject.toml; ``alma --help`` lists them by name).

A command module provides ``add_parser(subparsers)`` (which sets ``func``) ; any error exits
non-zero with a one-line reason on a line of its own (``-vv`` adds the traceback).

Every command's parser is built before the arguments are read, so this module and the command
modules import at their top only the standard library and what is as light (no torch, no config
models); each command imports what it runs inside its functions. ``alma --help`` then takes about
0.1 s of CPU instead of 2.5 s (docs/benchmarks.md, "Command-line start-up"; tests/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from alma_daemon.logs import configure_logging, error_text, print_error
from alma_daemon.registry import COMMANDS
from alma_daemon.training.ranks import launched_ranks, launched_with_ranks

if TYPE_CHECKING:
    from alma_daemon.config import Config


class _Subcommands(argparse._SubParsersAction):
    """argparse's subcommands, where a command's ``help`` (its line in the parent's ``--help``) also
    opens its own ``--help``, unless it gives a ``description``."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("description", kwargs.get("help"))
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        # ``alma simulate ... -v`` as ``alma -v simulate ...``: unset here, the value before the command stands.
        add_global_options(parser, default=argparse.SUPPRESS)
        return parser


def add_global_options(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """The options of every command (logging), accepted before the command and after it."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if default is None else default,
        help="more logging (-v info, -vv debug)",
    )
    parser.add_argument(
        "--log-json",
        action="store_true",
        default=False if default is None else default,
        help="log JSON lines instead of key=value",
    )


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose subcommands (and theirs) are :class:`_Subcommands`."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="alma", description="Anytime learning at macroscale: simulate, serve, watch.")
    add_global_options(parser)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:  # the entry points of group alma_daemon.commands: each names a command's module
        COMMANDS[name].add_parser(subparsers)
    return parser


def add_config_arguments(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """``--config FILE`` and repeatable ``--set key=value`` overrides."""
    parser.add_argument("--config", "-c", required=required, help="YAML config (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set learner.width=16 (repeatable)",
    )


def add_embedded_argument(parser: argparse.ArgumentParser) -> None:
    """``--embedded``: the command reads the state of a daemon run with ``alma run --embedded``."""
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="the daemon run with `alma run --embedded` (its folders: runs/<config>-embedded, runs/embedded)",
    )


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides, and with ``--embedded`` those of ``alma run --embedded``, so a command
    finds the folders that run derived from the config."""
    from alma_daemon.service.embedded_redis import EMBEDDED_OVERRIDES

    return [*args.overrides, *(EMBEDDED_OVERRIDES if getattr(args, "embedded", False) else ())]


#: Commands whose every rank has a part under torchrun (training/distributed.py,
#: service/rank_followers.py); the others would run whole once per rank, consuming a stream or
#: writing one folder N times.
RANKED_COMMANDS = frozenset({"simulate", "run"})


def check_config_under_ranks(config: Config) -> None:
    """What torchrun's ranks cannot run, refused at start-up rather than at the first stage, where a
    daemon would fail the same step at every restart.

    A policy that decides from the clock: each rank would read its own clock, and ranks that decide
    differently never meet at the collectives of a training stage. A batch smaller than the ranks,
    for a learner that splits every batch between them.
    """
    if not launched_with_ranks():
        return
    from alma_daemon.config import ConfigError
    from alma_daemon.learners import learner_class
    from policies import build_policy

    if build_policy(config.policy).time_based:
        raise ConfigError(
            f"policy.name: {config.policy.name!r} decides from the clock, which differs between "
            f"ranks; under torchrun use a policy that decides from the chunks (fixed)"
        )
    ranks = launched_ranks()
    if learner_class(config.learner.name).splits_batches_over_ranks and config.train.batch_size < ranks:
        raise ConfigError(
            f"train.batch_size: {config.train.batch_size} is smaller than the {ranks} ranks torchrun "
            f"started, and learner {config.learner.name!r} splits every batch between them"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Here, not at the top: `alma --help` (which exits above) never loads the config models.
    from alma_daemon.config import ConfigError

    configure_logging(args.verbose, args.log_json)
    command = " ".join(filter(None, (args.command, getattr(args, "action", None))))  # "config check"
    if launched_with_ranks() and args.command not in RANKED_COMMANDS:
        print(
            f"alma {args.command}: error: runs as one process; start it without torchrun (only "
            f"`alma simulate` and `alma run` train over ranks)",
            file=sys.stderr,
        )
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader that went away is a BrokenPipeError below
        return code
    except KeyboardInterrupt:
        print_error("alma: interrupted")
        return 130
    except BrokenPipeError:
        # stdout's reader stopped reading (`alma versions --json | head`): nothing left to tell it.
        # Python's flush at exit would fail again, so stdout points at /dev/null from here on.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a command that SIGPIPE stopped (128 + 13)
    except ConfigError as exc:
        print_error(f"alma {command}: config error: {exc}")
        return 2
    except Exception as exc:
        print_error(f"alma {command}: error: {error_text(exc)}")
        logging.getLogger("alma").debug("traceback", exc_info=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
