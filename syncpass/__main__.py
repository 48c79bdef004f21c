"""``python -m syncpass`` runs the command line."""

from __future__ import annotations

import sys

from syncpass.cli import main

sys.exit(main())
