"""Benchmarks of tokenspeed_lit: not part of the installed package (an engine imports `tokenspeed_lit`, never this).

Generated from the notebooks beside this file by `tools/export_bench.py`; `make bench` runs them on a GPU."""
