"""`dynrag bench flashrag`: dynrag against FlashRAG, the same methods on the same corpus, questions and model.

run.py is the command (`register`, `run`; table.py its `--table`); prepare.py readies the corpus, index and the
driver's configuration; launch.py starts each side: side.py under dynrag's python, driver.py (with probe.py,
loaded by path) as a script under FlashRAG's own python, in the venv env.py makes; methods.py pairs each dynrag
method with FlashRAG's pipeline class; report.py prints the figures.

The seam: outside jobs/bench, only locked_venv.py of this package is imported (tests/test_layout.py checks it).
"""
