"""`dynrag bench`: benchmarks that print figures (never assert); flashrag/ holds `bench flashrag` and its driver."""
