"""Moved to mooncake_cli.store.ha.leader: kept for importers."""

import sys

from mooncake_cli.store.ha import leader as _moved
from mooncake_cli.store.ha.leader import *  # noqa: F403

sys.modules[__name__] = _moved
