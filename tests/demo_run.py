"""What the demo's tests share: the demo as a subprocess, its default runs and a hybrid run (each once per worker: two
tests read one run), the size of a hybrid run `make test` affords, and readers of its summary."""
import functools, json, os, subprocess, sys, tempfile
from tokenspeed_lit.core.device import triton_interpreted


ENV = {**os.environ, 'PYTHONUNBUFFERED': '1'}


def demo(*args, timeout=600):
    return subprocess.run([sys.executable, '-m', 'tokenspeed_lit.demo', *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


@functools.lru_cache(maxsize=None)
def default_run(ranks: int):
    "`make demo`'s run (one rank: 64 requests, on every device, so that `make test-gpu` keeps its time), once per module."
    return demo('--ranks', str(ranks), '--requests', '24' if ranks > 1 else '64')


@functools.lru_cache(maxsize=None)
def hybrid_run():
    "`--model hybrid --no-l3` at HYBRID_N requests, once per module: (the finished process, its JSON report)."
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, 'r.json')
        r = demo('--model', 'hybrid', '--no-l3', '--requests', str(HYBRID_N), '--report', out)
        return r, (json.load(open(out)) if os.path.exists(out) else None)


# Hybrid runs as small as `make test` affords and large enough for a prefix hit: a shared system prompt's checkpoint
# must be checked before a later request with that prompt arrives. The CPU's config admits few short prompts a step
# (12 requests: hits); a GPU's admits 8 prompts of up to 300 tokens a step (12 and 16 requests: none, 20: 2, 24: 4).
HYBRID_N = 12 if triton_interpreted() else 24


def line(r, start):
    return next(l for l in r.stdout.splitlines() if l.startswith(start))


def servers_stopped(r) -> bool:
    "The master and store process the run names in its report are gone."
    pids = line(r, 'L3 tier').split('(pids ')[1].split(')')[0].split(', ')
    return len(pids) == 2 and not any(os.path.exists(f'/proc/{int(p)}') for p in pids)
