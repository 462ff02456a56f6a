"""tools/site/sitecustomize.py (Triton's CPU interpreter without its nested re-patching): the same numbers as Triton's
own interpreter, with fewer patches of triton.language. Each side runs in its own process, one with the folder on
PYTHONPATH and one without, on the same random inputs (batch 0 and 1 among them) and a launch that fails between two
good ones."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / 'tools' / 'site'

pytestmark = pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') != '1', reason='the CPU interpreter only')

SCRIPT = r'''
import json, torch, triton, triton.language as tl
import triton.runtime.interpreter as I
patches, core = [0], I._patch_lang_core
def counted(*a, **k):                      # called once per module each time triton.language is really patched
    patches[0] += 1
    return core(*a, **k)
I._patch_lang_core = counted

@triton.jit
def _scaled(x, k):
    return x * k

@triton.jit
def _rows(x_ptr, rows, B):
    x = tl.load(x_ptr + rows, mask=rows < B, other=0)
    return _scaled(x, 3)

@triton.jit
def _kernel(x_ptr, out_ptr, sum_ptr, B, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = _rows(x_ptr, rows, B) + tl.zeros([BLOCK], dtype=tl.int32)
    tl.store(out_ptr + rows, tl.cumsum(y, 0), mask=rows < B)
    tl.store(sum_ptr + tl.program_id(0), tl.sum(y, 0))

@triton.jit
def _bad(x_ptr):
    tl.store(x_ptr + tl.arange(0, 3), 1)   # not a power of two: the launch raises

g = torch.Generator().manual_seed(0)
runs, failed, launches = [], 0, 0
for B in (0, 1, 5, 16, 37):
    x = torch.randint(-1000, 1000, (max(B, 1),), generator=g, dtype=torch.int32)
    G = max(1, -(-B // 16))
    out, sums = torch.full((max(B, 1),), -7, dtype=torch.int32), torch.full((G,), -7, dtype=torch.int32)
    _kernel[(G,)](x, out, sums, B, BLOCK=16); launches += 1
    try: _bad[(1,)](x)
    except Exception: failed += 1
    launches += 1
    runs.append(dict(B=B, x=x.tolist(), out=out.tolist(), sums=sums.tolist()))
print(json.dumps(dict(runs=runs, failed=failed, launches=launches, patches=patches[0],
                      wrapped=I._patch_lang.__module__ == 'sitecustomize')))
'''

def _run(with_site: bool) -> dict:
    path = [str(SITE)] if with_site else []
    path += [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p and Path(p).resolve() != SITE]
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(path), 'TRITON_INTERPRET': '1'}
    r = subprocess.run([sys.executable, '-c', SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

def test_the_site_computes_what_the_interpreter_computes_with_fewer_patches():
    plain, fast = _run(False), _run(True)
    assert not plain['wrapped'] and fast['wrapped']
    assert plain['runs'] == fast['runs'] and plain['failed'] == fast['failed'] == 5
    for run in fast['runs']:                         # and both are right: 3x, summed within each block of 16 rows
        B = run['B']
        y = [3 * v for v in run['x'][:B]]
        want = [sum(y[b - b % 16:b + 1]) for b in range(B)]
        assert run['out'] == want + [-7] * (len(run['out']) - B)     # nothing written past B
        assert run['sums'] == [sum(y[i:i + 16]) for i in range(0, max(B, 1), 16)]
    # every launch patches its kernel's modules once, plus tl.core once for the first tl function it calls: at most
    # 3 module patches a launch; Triton's own interpreter patches again at every nested call
    assert fast['patches'] <= 3 * fast['launches'] < plain['patches']
