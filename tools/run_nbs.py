"""Execute notebooks and save their outputs in place (then `nbdev_clean` them).

`nbdev_test` runs notebooks but keeps no outputs; the docs show saved outputs, so GPU tables and plots
are produced with this script on a GPU machine:  python tools/run_nbs.py --flags gpu nbs/staging/10_positions.ipynb
Cells marked `#| eval: false` are skipped, as are cells marked with a test flag from settings.ini
(`tst_flags`) unless that flag is passed with --flags, exactly as `nbdev_test` decides. With --only TEXT, a flagged
cell runs only if its source contains TEXT (the others keep their saved outputs): one benchmark of a notebook re-run,
e.g. --flags gpu --only bench_serving_loop nbs/staging/16_input_buffers.ipynb."""
import argparse, configparser, os, sys, time
from pathlib import Path
from nbcells import split_directives, is_false

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--flags', default='', help='space separated test flags to run (e.g. gpu)')
    ap.add_argument('--only', default=None, help='run a flagged cell only if its source contains one of these comma-separated texts')
    ap.add_argument('notebooks', nargs='*')
    a = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    cfg = configparser.ConfigParser(); cfg.read(root / 'settings.ini')
    skip = set(cfg['DEFAULT'].get('tst_flags', '').split()) - set(a.flags.split())
    from execnb.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    nbs = [Path(p) for p in a.notebooks] or sorted((root / 'nbs').rglob('[0-9]*.ipynb'))
    sys.path.insert(0, str(root))
    failed = []
    for nbp in nbs:
        nbp = nbp.resolve()
        nb = read_nb(nbp)
        def _skip(cell):
            if cell.cell_type != 'code': return True
            d, _ = split_directives(cell.source)
            if is_false(d.get('eval', 'true')): return True
            if skip & d.keys(): return True
            flagged = set(cfg['DEFAULT'].get('tst_flags', '').split()) & d.keys()
            if a.only is not None and flagged and not any(t in cell.source for t in a.only.split(',')): return True
            return False
        t0 = time.time()
        print(f'== {nbp.name}', flush=True)
        sh = CaptureShell(nbp)
        os.chdir(nbp.parent)
        try:
            sh.run_all(nb, exc_stop=True, preproc=_skip)
        except Exception:
            print(sh.prettytb(fname=nbp), flush=True)
            failed.append(nbp.name)
            continue
        finally:
            os.chdir(root)
        write_nb(nb, nbp)
        print(f'   saved outputs ({time.time()-t0:.1f}s)', flush=True)
    import subprocess
    subprocess.run([str(Path(sys.executable).parent / 'nbdev_clean')] if (Path(sys.executable).parent / 'nbdev_clean').exists()
                   else ['nbdev_clean'], cwd=root, check=False)
    if failed:
        print('FAILED: ' + ', '.join(failed)); sys.exit(1)

if __name__ == '__main__':
    main()
