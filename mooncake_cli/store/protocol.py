"""Moved to mooncake_cli.store.wire.protocol: kept for importers."""

import sys

from mooncake_cli.store.wire import protocol as _moved
from mooncake_cli.store.wire.protocol import *  # noqa: F403

sys.modules[__name__] = _moved
