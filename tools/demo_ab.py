"""`make demo`'s in-loop input preparation, this tree against another revision, alternately in one run on one machine.

The host's speed moves between runs (and between device calls on a shared machine), so a change to the staging path
is judged against its baseline measured in the same run: the demo runs alternately on the baseline revision (a
`git archive` of it, unpacked into a temporary directory) and on this working tree, each a fresh process with the same
arguments, and the medians each run reports (`--report`: `prep_us` of `bench/results/demo.json`) are paired.

    python tools/demo_ab.py --base origin/main --pairs 2 -- --no-l3 --requests 512
    python tools/demo_ab.py --base HEAD~3 --out bench/results/demo_ab.json
    python tools/demo_ab.py --base 0ae4e6a --base-dir /tmp/base -- --no-l3     # the baseline exported beforehand

Prints one line per run and a table of the pairs (decode and mixed medians, in-loop and repeated at once), writes
them as JSON with the machine and versions (`--out`), and exits non-zero if any run failed its checks."""
import argparse, json, os, statistics, subprocess, sys, tarfile, tempfile, time, io
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEYS = ('decode_median', 'mixed_median', 'decode_hot', 'mixed_hot')


def export_revision(rev: str, dest: Path) -> Path:
    "The package of revision `rev` unpacked under `dest` (`git archive`, the package directory only)."
    tar = subprocess.run(['git', 'archive', rev, 'tokenspeed_lit'], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t: t.extractall(dest, filter='data')
    return dest


def _steps(rep: dict):
    "A report's step count: top-level now, `steps['steps']` in reports written before the run record moved up."
    s = rep.get('steps')
    return s.get('steps') if isinstance(s, dict) else s


def run_demo(pythonpath: Path, args: list, report: Path, env: dict) -> tuple[dict, float]:
    "One demo run with `pythonpath` first on the path; its JSON report and the wall time."
    e = {**env, 'PYTHONPATH': os.pathsep.join(p for p in (str(pythonpath), env.get('PYTHONPATH')) if p),
         'PYTHONUNBUFFERED': '1', 'HF_HUB_OFFLINE': '1'}
    t0 = time.time()            # run from `pythonpath` itself: `-m` puts the working directory first on the path
    p = subprocess.run([sys.executable, '-m', 'tokenspeed_lit.demo', '--report', str(report), *args], cwd=pythonpath,
                       env=e, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode or not report.exists():
        print(p.stdout[-3000:], p.stderr[-3000:], sep='\n', flush=True)
        return dict(passed=False, failure=f'exit code {p.returncode}'), wall
    return json.loads(report.read_text()), wall


def ab(base: str, pairs: int, demo_args: list, env: dict, base_dir: str | None = None, keep: str | None = None) -> dict:
    "Alternate `pairs` times: the baseline revision's demo, then this tree's; each run's `prep_us` and checks."
    runs = []
    with tempfile.TemporaryDirectory() as d:
        old = Path(base_dir).resolve() if base_dir else export_revision(base, Path(d) / 'base')
        for i in range(pairs):
            for side, path in (('base', old), ('new', ROOT)):
                rep, wall = run_demo(path, demo_args, Path(keep or d) / f'{side}{i}.json', env)
                us = rep.get('prep_us') or {}
                runs.append(dict(pair=i, side=side, passed=rep.get('passed', False), failure=rep.get('failure'),
                                 wall_s=round(wall, 1), steps=_steps(rep),
                                 decode_steps=((rep.get('parts') or {}).get('decode') or {}).get('steps'),
                                 **{k: us.get(k) for k in KEYS}))
                print(f"pair {i} {side:4s}: " + ', '.join(f"{k} {runs[-1][k]}" for k in KEYS) +
                      f" us; {'passed' if runs[-1]['passed'] else 'FAILED: ' + str(runs[-1]['failure'])}, {wall:.0f} s",
                      flush=True)
        machine = rep.get('machine')
    ratio = {k: [round(n[k] / b[k], 3) if b.get(k) and n.get(k) else None
                 for b, n in zip(runs[0::2], runs[1::2])] for k in KEYS}
    return dict(base=base, demo_args=demo_args, machine=machine, date=time.strftime('%Y-%m-%d'), runs=runs,
                new_over_base=ratio)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--base', default='origin/main', help='the baseline revision (default origin/main)')
    ap.add_argument('--pairs', type=int, default=2, help='base/new pairs, alternated (default 2)')
    ap.add_argument('--base-dir', default=None, help='the baseline package already exported here (a machine without '
                    'the repository: `git archive REV tokenspeed_lit | tar -x -C DIR`); --base then only names it')
    ap.add_argument('--out', default=None, help='write the pairs here as JSON')
    ap.add_argument('--keep', default=None, help="keep each run's own report here (base0.json, new0.json, ...)")
    ap.add_argument('demo_args', nargs='*', help='arguments for the demo (after --)')
    a = ap.parse_args(argv)
    if a.pairs < 1: ap.error(f'--pairs must be at least 1, got {a.pairs}')
    if a.keep: Path(a.keep).mkdir(parents=True, exist_ok=True)
    res = ab(a.base, a.pairs, a.demo_args, dict(os.environ), a.base_dir, a.keep)
    print(f"{'pair':>4} {'side':>4} " + ' '.join(f'{k:>14}' for k in KEYS))
    for r in res['runs']: print(f"{r['pair']:>4} {r['side']:>4} " + ' '.join(f"{r[k] if r[k] is not None else '-':>14}" for k in KEYS))
    print('new / base, per pair: ' + '; '.join(f"{k} {v}" for k, v in res['new_over_base'].items()))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1) + '\n')
    return 0 if all(r['passed'] for r in res['runs']) else 1


if __name__ == '__main__':
    sys.exit(main())
