"""`make bench`: the benchmarks and their comparisons."""
