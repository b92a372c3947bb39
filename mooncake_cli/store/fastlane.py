"""Moved to mooncake_cli.store.wire.fastlane: kept for importers."""

import sys

from mooncake_cli.store.wire import fastlane as _moved
from mooncake_cli.store.wire.fastlane import *  # noqa: F403

sys.modules[__name__] = _moved
