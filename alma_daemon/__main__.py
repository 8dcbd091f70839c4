import sys

from alma_daemon.cli import main

sys.exit(main())
