"""What the demo's tests share: the demo as a process of its own (forked from a zygote that has its imports done),
its default runs and a hybrid run (each once per worker: two tests read one run), the size of a hybrid run `make test`
affords, and readers of its summary."""
import functools, json, os, select, signal, subprocess, sys, tempfile, time
from tokenspeed_lit.core.device import HAS_ACCEL, triton_interpreted


ENV = {**os.environ, 'PYTHONUNBUFFERED': '1'}
HERE = os.path.dirname(os.path.abspath(__file__))


class Zygote:
    """tests/demo_zygote.py, started once per test process: each demo run is a fork of it, with torch, triton,
    transformers and the demo imported (6-7 CPU-seconds a fresh interpreter spends on a 2-core machine, about 30 runs
    in `make test`). Only where it has no thread but its own (a fork copies the calling thread alone), and only without
    an accelerator: asking CUDA whether a device is there (the package does at import) leaves a process whose forks
    cannot use it."""
    def __init__(self):
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, 'demo_zygote.py')], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=ENV, text=True)
        hello = json.loads(self.p.stdout.readline() or '{}')
        self.usable = hello.get('ready') and hello.get('threads') == 1

    def answer(self, timeout_s):
        "The zygote's next line, or None after `timeout_s`."
        if not select.select([self.p.stdout], [], [], max(timeout_s, 0))[0]: return None
        return json.loads(self.p.stdout.readline())

    def run(self, args, timeout):
        "`python -m tokenspeed_lit.demo *args` as a fork: a CompletedProcess; TimeoutExpired (the run killed) after `timeout` s."
        with tempfile.TemporaryDirectory() as d:
            out, err = os.path.join(d, 'out'), os.path.join(d, 'err')
            self.p.stdin.write(json.dumps(dict(args=list(args), stdout=out, stderr=err)) + '\n'); self.p.stdin.flush()
            pid, end = json.loads(self.p.stdout.readline())['pid'], time.monotonic() + timeout
            done = self.answer(timeout)
            if done is None:
                os.killpg(pid, signal.SIGKILL); self.answer(60)
                raise subprocess.TimeoutExpired(['tokenspeed_lit.demo', *args], timeout, open(out).read(), open(err).read())
            return subprocess.CompletedProcess([sys.executable, '-m', 'tokenspeed_lit.demo', *args], done['code'],
                                               open(out).read(), open(err).read())


@functools.lru_cache(maxsize=None)
def zygote() -> Zygote: return Zygote()


def demo(*args, timeout=600, fresh=False):
    "A demo run (`make demo`'s command line): forked from the zygote, or with `fresh` (or on a GPU) a new interpreter."
    if not (fresh or HAS_ACCEL) and zygote().usable: return zygote().run(args, timeout)
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
