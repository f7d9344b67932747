"""Import aliases of modules moved under ``benchmarks.engine`` (see each module)."""
