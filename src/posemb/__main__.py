"""``python -m posemb`` runs the ``posemb`` command."""

import sys

from .cli import main

sys.exit(main())
