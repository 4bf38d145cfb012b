"""Measurement: every bench runs as `python -m bench.<name>` (or `python bench/<name>.py`), over one closed-loop
load module (bench/load.py) and one definition of a percentile (bench/stats.py)."""
