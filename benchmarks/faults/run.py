"""Alias of :mod:`benchmarks.engine.scenarios.faults.run` for ``benchmarks/live``, which still imports this path; delete
this file once it imports ``benchmarks.engine.scenarios.faults.run``."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("benchmarks.engine.scenarios.faults.run")
