"""`tools/demo_ab.py`, the same-run comparison the staging notebooks cite: it runs `make demo` on a revision and on this
tree in turn and pairs what each run reports. Run here for real, on two tiny demos (the baseline: this revision)."""
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_ab_pairs_two_real_runs(tmp_path):
    out, keep = tmp_path / 'ab.json', tmp_path / 'runs'
    p = subprocess.run([sys.executable, 'tools/demo_ab.py', '--base', 'HEAD', '--pairs', '1', '--out', str(out),
                        '--keep', str(keep), '--', '--no-l3', '--requests', '4'], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert [(r['pair'], r['side'], r['passed']) for r in res['runs']] == [(0, 'base', True), (0, 'new', True)]
    assert sorted(f.name for f in keep.iterdir()) == ['base0.json', 'new0.json']
    for r, f in zip(res['runs'], ('base0.json', 'new0.json')):     # each run's medians are its own report's
        rep = json.loads((keep / f).read_text())
        # `HEAD` may be older than the tree (a GPU machine's copy): its report may nest the step count
        steps = rep['steps']['steps'] if isinstance(rep['steps'], dict) else rep['steps']
        assert r['decode_median'] == rep['prep_us']['decode_median'] and r['steps'] == steps
    assert set(res['new_over_base']) == {'decode_median', 'mixed_median', 'decode_hot', 'mixed_hot'}
    assert 'new / base, per pair' in p.stdout


def test_demo_ab_refuses_no_pairs():
    p = subprocess.run([sys.executable, 'tools/demo_ab.py', '--pairs', '0'], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and '--pairs must be at least 1, got 0' in p.stderr
