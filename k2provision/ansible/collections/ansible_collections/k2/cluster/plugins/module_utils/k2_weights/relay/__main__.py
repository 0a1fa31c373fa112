"""``python -m ...k2_weights.relay``: the relay from its sources (hosts run relay.pyz)."""

import sys

from .cli import main

sys.exit(main())
