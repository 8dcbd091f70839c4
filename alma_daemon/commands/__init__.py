"""The ``alma`` subcommands, one module each: ``add_parser(subparsers)`` declares its flags and
``run(args)`` does the work (see ``alma_daemon/cli.py``), importing inside it what it runs: the
parsers of every command are built for each ``alma`` call, ``alma --help`` included.
"""
