"""Moved to mooncake_cli.store.ha.election: kept for importers."""

import sys

from mooncake_cli.store.ha import election as _moved
from mooncake_cli.store.ha.election import *  # noqa: F403

sys.modules[__name__] = _moved
