import os
from hypothesis import settings, HealthCheck

import tokenspeed_lit.core.device  # noqa: F401  (decides TRITON_INTERPRET before any kernel module imports triton)

# Hypothesis profiles, one for each place the suite runs (HYPOTHESIS_PROFILE names one; else `gpu` where there is an
# accelerator, `ci` where there is none). Each property runs its profile's count, or `kernel_examples(n)`'s.
# - `ci`: `make test` on a CPU, CI's fresh 2-core clone among them, whose time issue 50 bounds (8 minutes, setup
#   included). Every kernel runs through the Triton interpreter (about 1 ms a program, 0.1-0.4 s an example of a
#   staging property): a property runs 40 examples, a kernel property CI_KERNEL_EXAMPLES. The depth is the GPU suite's.
# - `gpu`: `make test-gpu`, the deep counts: a property 50 examples, a kernel property its own n (80-150), compiled.
#   At 200 examples six properties (each example a new step, graph captures, compiles) ran past 90 s each and the
#   whole suite past 340 s on the H200, so `make test-gpu` could not keep its 240 s.
# - `sanitize`: `make sanitize`, the kernel tests under compute-sanitizer, where every kernel runs tens of times slower:
#   25 examples a property, kernel properties included (at 6 the five kernel test files took 30 s under memcheck on
#   the H200, once captures stopped emptying the cache). At 25 the seven files took 54 s in all (issue 40). They had
#   run past 500 s, not for the examples: with host backtraces on, memcheck kept every launch's Python frames, so no
#   step was freed and every synchronize slowed down as they piled up (tools/gpu_suite.py's docstring); the suite
#   now asks for device backtraces only.
settings.register_profile('ci', max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile('gpu', max_examples=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile('sanitize', max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Without an accelerator, one intra-op thread per process, this one and every process a test starts (OMP_NUM_THREADS),
# as the demo's ranks run on a CPU (demo.scheduler.threads_per_rank): `make test` runs several workers and their
# subprocesses on few cores, where torch's threads waiting for each other on a busy machine cost more than the work
# (test_hybrid.py: 15 CPU-seconds alone with one thread, 20 with two, 73 beside the other workers with two).
if not tokenspeed_lit.core.device.HAS_ACCEL:
    import torch
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))

PROFILE = os.environ.get('HYPOTHESIS_PROFILE', 'gpu' if tokenspeed_lit.core.device.HAS_ACCEL else 'ci')
settings.load_profile(PROFILE)
# A kernel property's examples under `ci`: at 80-150 (the GPU's counts) the five fill properties of
# test_input_buffers.py took 79 s of a 2-core CI run and the kernel files 215 s in all.
CI_KERNEL_EXAMPLES = 20


def kernel_examples(n: int) -> int:
    """Examples for a property that launches kernels: at least `n` on a GPU (more than a property's 50 where n is),
    the profile's own under the sanitizer, CI_KERNEL_EXAMPLES under `ci` (interpreted)."""
    if PROFILE == 'ci': return CI_KERNEL_EXAMPLES
    return settings.default.max_examples if PROFILE == 'sanitize' else max(n, settings.default.max_examples)


# ---- helpers shared by the kernel tests: poisoned outputs with guard bands, random page tables ----
import torch
from tokenspeed_lit.core.device import default_device

DEV = default_device()
POISON, GUARD = -12345, 6


def guarded(n, dtype, poison=POISON, guard=GUARD):
    "A poisoned buffer with `guard` elements on each side of an `n`-element output; returns (buffer, output)."
    buf = torch.full((n + 2 * guard,), poison, dtype=dtype, device=DEV)
    return buf, buf[guard:guard + n]


def assert_guards(buf, poison=POISON, guard=GUARD):
    "The guard bands of a `guarded` buffer still hold the poison."
    assert (buf[:guard] == poison).all(), 'wrote before the output'
    assert (buf[-guard:] == poison).all(), 'wrote past the output'


def guarded2d(rows, cols, dtype, poison=POISON, guard=GUARD):
    "A poisoned `[rows + 2 guard, cols + 2 guard]` buffer and its `[rows, cols]` window (a strided view)."
    buf = torch.full((rows + 2 * guard, cols + 2 * guard), poison, dtype=dtype, device=DEV)
    return buf, buf[guard:guard + rows, guard:guard + cols]


def assert_guards2d(buf, rows, cols, poison=POISON, guard=GUARD):
    "Everything of a `guarded2d` buffer outside its window still holds the poison."
    inside = torch.zeros_like(buf, dtype=torch.bool)
    inside[guard:guard + rows, guard:guard + cols] = True
    assert (buf[~inside] == poison).all(), 'wrote outside the output'


def random_table(g, rows, cols, null=0.2):
    "A page table of random pages, with holes: about `null` of the entries -1 and half as many the null page 0."
    table = torch.randint(1, 1000, (rows, cols), generator=g, dtype=torch.int32)
    table[torch.rand(rows, cols, generator=g) < null] = torch.tensor(-1, dtype=torch.int32)
    table[torch.rand(rows, cols, generator=g) < null / 2] = 0
    return table


# ---- a test that runs past TOKENSPEED_LIT_TEST_HANG_S seconds dumps every thread's stack into
# TOKENSPEED_LIT_TEST_HANG_DIR (make test-gpu sets both): a run cut off at its time limit still says where it was.
import faulthandler, pytest as _pytest

@_pytest.fixture(autouse=True)
def _hang_report(request):
    after, where = float(os.environ.get('TOKENSPEED_LIT_TEST_HANG_S', 0) or 0), os.environ.get('TOKENSPEED_LIT_TEST_HANG_DIR')
    if not (after and where):
        yield; return
    path = os.path.join(where, f"{os.getpid()}-{request.node.nodeid.replace('/', '_').replace('::', '-')[:150]}.txt")
    with open(path, 'w') as f:
        f.write(request.node.nodeid + '\n'); f.flush()
        faulthandler.dump_traceback_later(after, exit=False, file=f)
        try: yield
        finally: faulthandler.cancel_dump_traceback_later()
    if os.path.getsize(path) <= len(request.node.nodeid) + 1: os.remove(path)   # finished in time: nothing to keep


# ---- the Mooncake client logs (glog, straight to file descriptor 2) from its own threads and its destructors. Inside a
# test pytest captures them (a failing test shows them); outside a test nothing does: a pytest-xdist worker's stray lines
# and the lines of the clients destroyed at exit go to a file in the temp directory instead of the run's output.
def _stderr_to_file(what: str):
    import sys, tempfile
    sys.stderr.flush()
    fd = os.open(os.path.join(tempfile.gettempdir(), f'tokenspeed_lit-{what}-{os.getpid()}.log'),
                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2); os.close(fd)

@_pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if hasattr(config, 'workerinput'): _stderr_to_file('worker')    # (the controller keeps its stderr)

import atexit
atexit.register(_stderr_to_file, 'exit')   # after pytest has put its own stderr back: the clients destroyed at exit
