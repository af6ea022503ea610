"""What a poolsim command does end to end, on top of the simulator: the server its flags describe, one run, a plan
beside others, a sweep of runs, the bench_serving client, and the output folders they write."""
