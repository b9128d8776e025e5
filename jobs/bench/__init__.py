"""`dynrag bench`: benchmarks that print figures (never assert), one command a module here; rig/ holds what they
measure with and run on (no command), flashrag/ `bench flashrag` and its driver."""
