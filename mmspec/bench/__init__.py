"""`mmspec bench`: the side-by-side benchmark harness and the text benchmarks (BENCHMARKS.md)."""
