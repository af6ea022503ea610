"""What a poolsim command does end to end, on top of the simulator: one run, a sweep of runs, the bench_serving
client, and the output folders they write."""
