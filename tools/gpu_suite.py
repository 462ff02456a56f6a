"""The whole test suite on a GPU in one call (`make test-gpu`), and the kernel tests under compute-sanitizer's memcheck
(`make sanitize`). Both record what they ran in bench/results/gpu_suite.json.

    python tools/gpu_suite.py               # every notebook (nbdev_test, in the background) + every pytest test but
                                            # the docs site's (-n 10), at the same time
    python tools/gpu_suite.py --sanitize    # the kernel tests (positions, staging ring, fused decode, input buffers,
                                            # page tables, host mirror and transports), one sanitized process per file,
                                            # all at once
    python tools/gpu_suite.py --sanitize --backtraces   # the same with compute-sanitizer's host backtraces in its
                                            # reports (to find where a reported error's launch came from): slow, see below

The docs-site tests need Sphinx and Chromium, which a GPU machine without a package index lacks; CI runs them.
Under the sanitizer the caching allocator is off (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`): memcheck sees a write past a
tensor only when the tensor ends where its allocation ends, and the allocator's blocks are larger than the tensors
they hold. A write that stays inside one allocation it never sees, which is why the tests' poisoned guard bands stay.
Hypothesis runs its small `sanitize` profile there (tests/conftest.py).

Why `make sanitize` stopped finishing (issue 40; measured on the H200, compute-sanitizer 2025.3.1, torch 2.11,
Triton 3.6): not the examples, the graph captures or the pinned allocations, but a leak the sanitizer's own host
backtraces cause. With `--show-backtrace yes` (its default) memcheck keeps the Python frames of every launch for the
backtrace it would print, and the frames hold their locals: no FusedDecodeStep, InputBuffers or StagingRing built in
a sanitized process was ever freed (after `gc.collect()`, 218 of 218 rings alive at the end of test_fused_decode.py,
152 of 152 in test_staging_ring.py; 0 without the sanitizer), so every step's device buffers, pinned slots and four
CUDA graphs piled up. Under memcheck a `torch.cuda.synchronize()` costs more the more the process holds: in
test_fused_decode.py 707 synchronizes took 216 of its 267 s (0.31 s each on average; its 864 graph captures 8 s, its
pinned allocations 0.01 s), in test_staging_ring.py 671 took 111 of 139 s. So a test got slower the later it ran (a
bad-input test 1.2 s with 127 steps alive, 1.7 s with 148; the file's last property, 50 steps, 118 s against 1.1 s
without the sanitizer), and a file's time grew with the square of the steps it builds: 25 examples instead of 6 made
four times the steps, each synchronize about four times slower. That is why the fused decode file went past 480 s
though the kernel work it checks had hardly grown.
`--show-backtrace device` (or `no`) keeps no host frames: every step is freed (0 of 25 rings alive after the same
workload; with `host`, 25 of 25), memcheck still checks every access and counts every error, and the whole run took
54 s (0 errors, 405 passed, none skipped: the dropped-step test runs under the sanitizer again; the fused decode
file 32 s, its last property 117.7 s -> 5.7 s). A report then names the kernel, thread, block and address, with the
device backtrace, but not the Python line that launched it: rerun with `--backtraces` for that (slow, and the
dropped-step test is skipped there)."""
import argparse, importlib.util, json, os, re, shutil, subprocess, sys, tempfile, time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / 'bench' / 'results' / 'gpu_suite.json'
KERNEL_TESTS = ['tests/test_positions.py', 'tests/test_staging_ring.py', 'tests/test_fused_decode.py',
                'tests/test_input_buffers.py', 'tests/test_page_tables.py', 'tests/test_host_mirror.py',
                'tests/test_host_transport.py']


def _xdist(workers: int) -> list[str]:
    "`-n workers` where pytest-xdist is installed (the GPU image has it), else nothing: the tests run one by one."
    try: from importlib.metadata import version; v = tuple(int(x) for x in version('pytest-xdist').split('.')[:2])
    except Exception: return []
    # xdist's default hands each worker a run of consecutive tests at the start: one worker got all seven demo tests
    # (250 s in a row on the H200) while the others idled. `worksteal` (xdist >= 3.2) lets an idle worker take them.
    return ['-n', str(workers), *(['--dist', 'worksteal'] if v >= (3, 2) else [])]


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


_GLOG = re.compile(r'^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: Logging before InitGoogleLogging)')


def _tail(path: Path, n: int = 25) -> str:
    "The last `n` lines of a log, without the Mooncake client's glog lines (they drown a notebook's traceback)."
    lines = [l for l in path.read_text(errors='replace').splitlines() if not _GLOG.match(l)]
    return '\n'.join(lines[-n:])


def _wait_all(procs: dict, t0: float, every: float = 20.0, ended: dict | None = None) -> dict:
    "Wait for every `{name: Popen}`, printing which are still running every `every` seconds; `{name: returncode}` (`ended`: name -> seconds)."
    rcs, last = {}, time.time()
    while len(rcs) < len(procs):
        for name, p in procs.items():
            if name not in rcs and p.poll() is not None:
                rcs[name] = p.returncode
                if ended is not None: ended[name] = round(time.time() - t0, 1)
                print(f'  {name}: {"passed" if p.returncode == 0 else f"FAILED (rc {p.returncode})"} at {time.time() - t0:.0f} s', flush=True)
        if time.time() - last > every:
            print(f'  still running at {time.time() - t0:.0f} s: {", ".join(n for n in procs if n not in rcs)}', flush=True)
            last = time.time()
        time.sleep(0.5)
    return rcs


def suite(workers: int) -> int:
    "The notebooks (nbdev_test, in the background) and pytest (-n workers) at the same time; both must pass."
    env = {**os.environ, 'PYTHONPATH': f'{ROOT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}'}
    t0 = time.time()
    nbtest = shutil.which('nbdev_test') or str(Path(sys.executable).parent / 'nbdev_test')
    with tempfile.TemporaryDirectory() as d:
        logs, procs = {}, {}
        for path in ('nbs', 'bench'):
            logs[path] = Path(d) / f'{path}.log'
            print(f'$ nbdev_test --path {path} --n_workers 3  (in the background, output after pytest)', flush=True)
            procs[path] = subprocess.Popen([nbtest, '--path', path, '--n_workers', '3', '--timing'], cwd=ROOT, env=env,
                                           stdout=logs[path].open('w'), stderr=subprocess.STDOUT)
        junit = Path(d) / 'junit.xml'
        hangs = os.environ.get('TOKENSPEED_LIT_TEST_HANG_DIR') or str(Path(d) / 'hangs')
        os.makedirs(hangs, exist_ok=True)
        env = {'TOKENSPEED_LIT_TEST_HANG_S': '90', **env, 'TOKENSPEED_LIT_TEST_HANG_DIR': hangs}
        limit = ['--timeout=200'] if importlib.util.find_spec('pytest_timeout') else []   # a hung test fails, named
        rc, pytest_s, _ = _pytest([*_xdist(workers), *limit, '-rfE', '--durations=25', '--ignore=tests/test_docs_site.py',
                                   'tests/'], env, junit)
        counts = _counts(junit)
        nb_rcs = _wait_all(procs, t0)
        for path in procs: print(f'--- nbdev_test --path {path} (last lines)\n{_tail(logs[path], 80)}', flush=True)
    nb_rc = int(any(nb_rcs.values()))
    duration = time.time() - t0
    _record(**counts, duration_s=round(duration, 1), pytest_s=round(pytest_s, 1), notebooks_passed=nb_rc == 0,
            pytest_workers=workers)
    print(f'gpu suite: notebooks {"passed" if nb_rc == 0 else "FAILED"}, pytest {counts}, {duration:.0f} s')
    return rc or nb_rc


def sanitize(workers: int, backtraces: bool = False, logs: str | None = None) -> int:
    "Each kernel test file under memcheck in its own process, `workers` at a time (xdist's workers never got going there)."
    tool = shutil.which('compute-sanitizer') or '/usr/local/cuda/bin/compute-sanitizer'
    env = {**os.environ, 'PYTORCH_NO_CUDA_MEMORY_CACHING': '1', 'HYPOTHESIS_PROFILE': 'sanitize',
           'PYTHONPATH': f'{ROOT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}'}
    # API errors are left out: cuda-bindings' loader asks cuGetProcAddress for every driver function, and each one
    # this driver lacks is reported as an error (34 in a run on the H200), though no memory is touched.
    # Device backtraces only (`--show-backtrace device`): to print host backtraces memcheck keeps the Python frames of
    # every launch, so no step is ever freed and the run slows down as the steps pile up (the docstring).
    prefix = [tool, '--tool', 'memcheck', '--report-api-errors', 'no', '--target-processes', 'all', '--print-limit', '20',
              '--show-backtrace', 'yes' if backtraces else 'device']
    # With them, the one test that checks a dropped step is freed at once is skipped (TOKENSPEED_LIT_SANITIZER):
    # the sanitizer's frames hold the step.
    if backtraces: env['TOKENSPEED_LIT_SANITIZER'] = '1'
    t0 = time.time()
    counts, errors, summaries, rcs, ended = dict(passed=0, failed=0, skipped=0), 0, 0, {}, {}
    with tempfile.TemporaryDirectory() as d:
        d = logs or d
        os.makedirs(d, exist_ok=True)
        files = {f: (Path(d) / f'{Path(f).stem}.xml', Path(d) / f'{Path(f).stem}.log') for f in KERNEL_TESTS}
        for i in range(0, len(KERNEL_TESTS), workers):            # `workers` sanitized processes at a time
            procs = {}
            for f in KERNEL_TESTS[i:i + workers]:
                junit, log = files[f]
                cmd = [*prefix, sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--durations=10',
                       f'--junitxml={junit}', f]
                print('$', ' '.join(cmd), flush=True)
                procs[f] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open('w'), stderr=subprocess.STDOUT)
            rcs.update(_wait_all(procs, t0, every=30.0, ended=ended))
        for f, (junit, log) in files.items():
            out = log.read_text(errors='replace')
            c = _counts(junit) if junit.exists() else dict(passed=0, failed=1, skipped=0)
            for k in counts: counts[k] += c[k]
            errors += sum(int(n) for n in re.findall(r'ERROR SUMMARY: (\d+) errors?$', out, re.M))   # not '... were not printed'
            summaries += len(re.findall(r'ERROR SUMMARY: \d+ errors?$', out, re.M))
            print(f'--- {f}: {c}, rc {rcs.get(f)}, {ended.get(f)} s\n{_tail(log, 24)}', flush=True)
        complete = summaries == len(KERNEL_TESTS) and all(junit.exists() for junit, _ in files.values())
    duration = time.time() - t0
    _record(sanitizer_complete=complete, sanitized_files=[Path(f).name for f in KERNEL_TESTS],
            sanitizer_errors=errors, sanitized_tests=counts['passed'] + counts['failed'], sanitizer_passed=counts['passed'],
            sanitizer_failed=counts['failed'], sanitizer_skipped=counts['skipped'], sanitizer_duration_s=round(duration, 1),
            sanitizer_processes=summaries, sanitizer_file_s={Path(f).name: ended.get(f) for f in KERNEL_TESTS},
            sanitizer_command=' '.join(['compute-sanitizer', *prefix[1:]]))
    print(f'sanitizer: {errors} errors in {summaries} processes, tests {counts}, {duration:.0f} s')
    return 1 if errors or not summaries or counts['failed'] or any(rcs.values()) else 0


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--sanitize', action='store_true', help='the kernel tests under compute-sanitizer memcheck')
    ap.add_argument('-n', '--workers', type=int, default=None,
                    help='pytest-xdist workers (default 10), or sanitized processes at once (default: one per test file)')
    ap.add_argument('--backtraces', action='store_true',
                    help="--sanitize: host backtraces in the sanitizer's reports (slow: no step is ever freed; this file's docstring says why)")
    ap.add_argument('--logs', help='--sanitize: keep each file\'s log and junit report in this folder')
    a = ap.parse_args()
    sys.exit(sanitize(a.workers or len(KERNEL_TESTS), a.backtraces, a.logs) if a.sanitize else suite(a.workers or 10))
