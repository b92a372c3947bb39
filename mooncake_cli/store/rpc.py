"""Moved to mooncake_cli.store.wire.rpc: kept for importers."""

import sys

from mooncake_cli.store.wire import rpc as _moved
from mooncake_cli.store.wire.rpc import *  # noqa: F403

sys.modules[__name__] = _moved
