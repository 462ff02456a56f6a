"""Export the benchmark notebooks of `bench/` into the `bench` package (`bench/*.py`), as `nbdev_export` does for the
library: `bench/` is not part of the installed package (`setup.py` packages `tokenspeed_lit` only), so nbdev's own
export, which writes into `lib_path`, does not see it.

    python tools/export_bench.py          # (make test checks that it leaves no diff)"""
from pathlib import Path
from nbdev.export import nb_export

BENCH = Path(__file__).resolve().parent.parent / 'bench'

def main():
    for nb in sorted(BENCH.glob('[0-9]*.ipynb')): nb_export(nb, BENCH)

if __name__ == '__main__':
    main()
