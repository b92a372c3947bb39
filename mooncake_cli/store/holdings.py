"""Moved to mooncake_cli.store.client.holdings: kept for importers."""

import sys

from mooncake_cli.store.client import holdings as _moved
from mooncake_cli.store.client.holdings import *  # noqa: F403

sys.modules[__name__] = _moved
