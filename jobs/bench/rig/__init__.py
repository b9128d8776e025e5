"""What the benchmarks measure with and run on, apart from the `dynrag bench` commands in jobs/bench/: a process
tree's peak RSS (rss.py), a memory cgroup cap (memory_cap.py), the arithmetic bound (roofline.py), the latency
model's backends and its KV cache (simulated.py, kv_model.py), the DPR-shaped synthetic corpus (dpr_synthetic.py),
and the measured child processes (`python -m jobs.bench.rig.questions_child`, `... .scale_child`)."""
