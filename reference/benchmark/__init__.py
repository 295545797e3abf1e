"""Measuring latency: the floor (bandwidth probe), timing, the bench_latency run, its report, baselines."""
