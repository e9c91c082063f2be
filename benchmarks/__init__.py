"""memable's benchmarks: ``python -m benchmarks`` (see ``__main__``)."""
