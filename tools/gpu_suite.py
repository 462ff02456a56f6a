"""The whole test suite on a GPU in one call (`make test-gpu`), and the kernel tests under compute-sanitizer's memcheck
(`make sanitize`). Both record what they ran in bench/results/gpu_suite.json.

    python tools/gpu_suite.py               # every notebook (nbdev_test) + every pytest test but the docs site's, -n 8
    python tools/gpu_suite.py --sanitize    # positions, fused decode, page tables, host mirror and transports tests

The docs-site tests need Sphinx and Chromium, which a GPU machine without a package index lacks; CI runs them.
Under the sanitizer the caching allocator is off (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`): memcheck sees a write past a
tensor only when the tensor ends where its allocation ends, and the allocator's blocks are larger than the tensors
they hold. A write that stays inside one allocation it never sees, which is why the tests' poisoned guard bands stay.
Hypothesis runs its small `sanitize` profile there (tests/conftest.py)."""
import argparse, json, os, re, shutil, subprocess, sys, tempfile, time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / 'bench' / 'results' / 'gpu_suite.json'
KERNEL_TESTS = ['tests/test_positions.py', 'tests/test_fused_decode.py', 'tests/test_page_tables.py',
                'tests/test_host_mirror.py', 'tests/test_host_transport.py']


def _xdist(workers: int) -> list[str]:
    "`-n workers` where pytest-xdist is installed (the GPU image has it), else nothing: the tests run one by one."
    try: import xdist  # noqa: F401
    except ImportError: return []
    return ['-n', str(workers)]


def _counts(junit: Path) -> dict:
    "passed / failed / skipped of a junit report (errors count as failed)."
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == 'testsuite' else suite.find('testsuite')
    n, f, e, s = (int(suite.get(k, 0)) for k in ('tests', 'failures', 'errors', 'skipped'))
    return dict(passed=n - f - e - s, failed=f + e, skipped=s)


def _env_info() -> dict:
    import torch, triton
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__)


def _record(**fields):
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**old, **_env_info(), **fields}, indent=1) + '\n')


def _pytest(args: list[str], env: dict, junit: Path, prefix: list[str] = ()) -> tuple[int, float, str]:
    t0 = time.time()
    cmd = [*prefix, sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', f'--junitxml={junit}', *args]
    print('$', ' '.join(cmd), flush=True)
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:                          # streamed: a run stopped at its time limit still shows its progress
        print(line, end='', flush=True); lines.append(line)
    return p.wait(), time.time() - t0, ''.join(lines)


def suite(workers: int) -> int:
    env = {**os.environ, 'PYTHONPATH': f'{ROOT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}'}
    t0 = time.time()
    nbtest = shutil.which('nbdev_test') or str(Path(sys.executable).parent / 'nbdev_test')
    nb_rc = 0
    for path in ('nbs', 'bench'):
        print(f'$ nbdev_test --path {path}  ({time.time() - t0:.0f} s)', flush=True)
        nb_rc |= subprocess.run([nbtest, '--path', path, '--n_workers', '8', '--timing'], cwd=ROOT, env=env).returncode
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / 'junit.xml'
        rc, _, _ = _pytest([*_xdist(workers), '--durations=15', '--ignore=tests/test_docs_site.py', 'tests/'], env, junit)
        counts = _counts(junit)
    duration = time.time() - t0
    _record(**counts, duration_s=round(duration, 1), notebooks_passed=nb_rc == 0, pytest_workers=workers)
    print(f'gpu suite: notebooks {"passed" if nb_rc == 0 else "FAILED"}, pytest {counts}, {duration:.0f} s')
    return rc or nb_rc


def sanitize(workers: int) -> int:
    tool = shutil.which('compute-sanitizer') or '/usr/local/cuda/bin/compute-sanitizer'
    env = {**os.environ, 'PYTORCH_NO_CUDA_MEMORY_CACHING': '1', 'HYPOTHESIS_PROFILE': 'sanitize',
           'PYTHONPATH': f'{ROOT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}'}
    prefix = [tool, '--tool', 'memcheck', '--target-processes', 'all', '--print-limit', '20']
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / 'junit.xml'
        rc, duration, out = _pytest([*_xdist(workers), *KERNEL_TESTS], env, junit, prefix)
        counts = _counts(junit) if junit.exists() else dict(passed=0, failed=0, skipped=0)
    # one summary per sanitized process; a process with errors says so, and "ERROR SUMMARY: 0 errors" otherwise
    errors = sum(int(n) for n in re.findall(r'ERROR SUMMARY: (\d+) error', out))
    summaries = len(re.findall(r'ERROR SUMMARY:', out))
    _record(sanitizer_errors=errors, sanitized_tests=counts['passed'] + counts['failed'],
            sanitizer_failed=counts['failed'], sanitizer_duration_s=round(duration, 1), sanitizer_processes=summaries)
    print(f'sanitizer: {errors} errors in {summaries} processes, tests {counts}, {duration:.0f} s')
    return rc or (1 if errors or not summaries else 0)


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--sanitize', action='store_true', help='the kernel tests under compute-sanitizer memcheck')
    ap.add_argument('-n', '--workers', type=int, default=8, help='pytest-xdist workers (default 8)')
    a = ap.parse_args()
    sys.exit(sanitize(a.workers) if a.sanitize else suite(a.workers))
