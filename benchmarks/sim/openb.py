"""Alias of :mod:`benchmarks.engine.openb` for ``benchmarks/live``, which still imports this path; delete
this file once it imports ``benchmarks.engine.openb``."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("benchmarks.engine.openb")
