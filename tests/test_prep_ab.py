"""`tools/prep_ab.py`, the in-process comparison of a step's input preparation: the baseline package imported under
another name beside this tree's, one loop alternating between them. Run here for real (the baseline: this revision)."""
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_prep_ab_alternates_two_packages_in_one_process(tmp_path):
    out = tmp_path / 'ab.json'
    p = subprocess.run([sys.executable, 'tools/prep_ab.py', '--base', 'HEAD', '--steps', '2', '--batches', '1', '3',
                        '--only', 'captured', '--out', str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    rows = rep['rows']
    assert {'device', 'torch', 'triton'} <= rep['env'].keys() and rep['env']['torch'] in rep['machine']
    assert [r['step'] for r in rows] == ['decode 1, captured', 'decode 3, captured']
    assert all(r['same_buffers'] and r['base_us'] > 0 and r['new_us'] > 0 for r in rows)
    assert 'new/base' in p.stdout
