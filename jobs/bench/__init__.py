"""`dynrag bench`: benchmarks that print figures (never assert), and the FlashRAG peer's driver."""
