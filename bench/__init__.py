"""Benchmarks of tokenspeed_lit: not part of the installed package (an engine imports `tokenspeed_lit`, never this).

The modules are generated from the notebooks beside this file by `tools/export_bench.py` (checked by `make test`),
except `l3.py`, the L3 tier against the bare Mooncake client, a script (`python bench/l3.py`) that starts its own
Mooncake servers. `make bench` runs them on a GPU and writes `bench/results/*.json`."""
