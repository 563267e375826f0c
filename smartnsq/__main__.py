"""``python -m smartnsq`` runs the command line."""

import sys

from smartnsq.cli import main

sys.exit(main())
