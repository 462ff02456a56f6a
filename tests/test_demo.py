"""`make demo` at its CPU defaults, one rank and two (gloo), plus fault injection: the checks must catch a stale
padded tail, a write into a free page and a wrong page in a request's history (through its logits), exit non-zero,
and name the request, position and slot. With Mooncake installed the default run has the L3 scenario (a second
engine instance loading the shared prefixes the first stored); the hybrid model's runs are in test_demo_hybrid.py and
the L3 scenario's others in test_demo_l3.py, the tensor-parallel runs in test_demo_tp.py (files pytest-xdist runs
side by side). A fault the options cannot fire is a usage error before anything is built, every injection is counted
(`fault_fired` in the report), and a run whose fault never fired fails."""
import hashlib, json, os, subprocess, sys, time
import numpy as np
import pytest
from l3_servers import mooncake_missing
from tokenspeed_lit.core.device import triton_interpreted
from demo_run import ENV, demo, default_run, HYBRID_N, line, servers_stopped


@pytest.mark.parametrize('ranks', [1, 2])
def test_demo_passes_every_check(ranks):
    r = default_run(ranks)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'all checks passed' in r.stdout
    assert f'ranks                {ranks}' in r.stdout
    assert int(line(r, 'requests finished').split()[2].rstrip(',')) > 0
    assert "each output equal to generate's" in line(r, 'requests finished')
    logits, kv = line(r, 'logits compared').split(), line(r, 'KV compared').split()
    assert int(logits[2]) > 0 and int(kv[2]) > 0
    tol = float(logits[logits.index('(tolerance') + 1].rstrip(');'))
    assert float(logits[logits.index('|difference|') + 1]) <= tol and float(kv[kv.index('|difference|') + 1]) <= tol
    for words in ('replays of a captured graph', 'offloads', 'single-token verifies', 'model: transformers Llama', 'transformers 5.'):
        assert words in r.stdout
    for words in ('staged for the decode graph', 'fill_input_buffers', 'gen-0 collections'):
        assert words in line(r, 'input prep per step') + line(r, 'garbage collector')
    assert line(r, 'setup: ').startswith('setup: the model is built here from its config, random weights, nothing downloaded')
    assert r.stdout.index('setup: ') < r.stdout.index('steps ')              # said before the run
    assert ('interpreter figures' in r.stdout) == triton_interpreted()      # the timings labelled where they mean nothing
    if ranks > 1: assert line(r, 'L3 tier').endswith('skipped: --ranks 2 (the L3 scenario runs with one rank)')
    # not a terminal: each progress bar (a second instance has its own) writes plain lines, one per tenth of its
    # requests, no carriage returns
    assert '\r' not in r.stderr
    bars = [l for l in r.stderr.splitlines() if 'requests finished' in l]
    assert 1 <= sum('(instance 2)' not in l for l in bars) <= 10, r.stderr
    assert sum('(instance 2)' in l for l in bars) <= 10, r.stderr


@mooncake_missing
def test_demo_l3_scenario_by_default():
    "The default run's second instance loads the shared system prompts' pages from L3 instead of prefilling them."
    r = default_run(1)
    assert r.returncode == 0, r.stdout + r.stderr
    put, hits, failed = line(r, 'L3 put (instance 1)').split(), line(r, 'L3 hits (instance 2)').split(), line(r, 'L3 failed gets').split()
    assert int(put[4]) > 0 and int(hits[4]) > 0                     # pages put, pages hit
    words = line(r, 'L3 hits (instance 2)').split()
    saved = int(words[words.index('prefill') - 1])
    assert saved == int(hits[4]) * 4 > 0                            # page size 4: every loaded page saves its tokens
    assert int(failed[3]) == 0
    assert 'byte-identical' in line(r, 'L3 checks') and "each output equal to generate's" in line(r, 'instance 2 ')
    assert 'L3 fault' not in r.stdout and servers_stopped(r)


@pytest.mark.parametrize('fault, ranks, words', [
    ('stale-tail', 1, ['out_cache_loc_buf', 'padding', 'slot', '= request', 'position']),
    ('stray-write', 2, ['slot', 'owned by no request']),
    ('wrong-page', 1, ['logits of request', 'at position', 'slot', "differ from transformers'", 'tolerance']),
])
def test_demo_catches_injected_faults(fault, ranks, words, tmp_path):
    # (--no-l3: each fault strikes the first instance; a second, and the L3 servers, would only start and stop)
    r = demo('--fault', fault, '--ranks', str(ranks), '--requests', '16', '--no-l3', '--report', str(tmp_path / 'r.json'))
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if 'VIOLATION' in l)
    for w in words: assert w in line, line
    rep = json.loads((tmp_path / 'r.json').read_text())          # how often it fired before the checks caught it
    if ranks == 1: assert rep['fault_fired'] == 1 and f'{fault}: injected 1 time' in r.stdout, r.stdout
    else: assert rep['fault_fired'] is None and 'injections unknown (the run failed before it reported them)' in r.stdout, r.stdout


@pytest.mark.parametrize('args, msg', [
    (['--ranks', '0'], 'argument --ranks: must be an integer in [1, 64], got 0'),
    (['--ranks', 'two'], "argument --ranks: 'two' is not an integer"),
    (['--requests', '0'], 'argument --requests: must be an integer in [1, {MAX_REQUESTS}], got 0'),
    (['--requests', '-3'], 'argument --requests: must be an integer in [1, {MAX_REQUESTS}], got -3'),
    (['--seed', '-1'], 'argument --seed: must be an integer in [0, 9223372036854775807], got -1'),
    (['--verify-width', '0'], 'argument --verify-width: must be an integer in [1, 8], got 0'),
    (['--fault', 'boom'], "argument --fault: invalid choice: 'boom'"),
    (['--fault', 'l3-down', '--ranks', '2'], '--fault l3-down needs the L3 scenario, which this run skips: --ranks 2'),
    (['--l3-hosts', '--ranks', '2'], 'argument --l3-hosts: it runs the L3 scenario, which this run skips: --ranks 2'),
    (['--model', 'mamba'], "argument --model: invalid choice: 'mamba'"),
    (['--tp', '0'], 'argument --tp: must be an integer in [1, 2], got 0'),
    (['--tp', '4'], 'argument --tp: must be an integer in [1, 2], got 4'),
    (['--tp', 'two'], "argument --tp: 'two' is not an integer"),
    (['--tp', '2', '--model', 'hybrid'], 'argument --tp: --model hybrid runs with --tp 1, got --tp 2 (tensor parallel is '
                                         'built for the Llama only'),
    (['--fault', 'wrong-shard', '--no-l3'], '--fault wrong-shard needs --tp 2, got --tp 1'),
    (['--fault', 'wrong-shard', '--ranks', '2'], '--fault wrong-shard needs --tp 2, got --tp 1'),
    (['--tp', '2', '--l3-hosts'], 'argument --l3-hosts: runs with --tp 1, got --tp 2'),
    (['--fault', 'l3-wrong-rank', '--no-l3', '--tp', '2'], '--fault l3-wrong-rank needs the L3 scenario, which this run skips'),
    (['--model', 'hybrid', '--no-l3', '--verify-width', '3'], '--model hybrid runs with --verify-width at most 2'),
    (['--fault', 'wrong-checkpoint', '--no-l3'], '--fault wrong-checkpoint needs --model hybrid'),
    (['--fault', 'rejected-draft', '--no-l3'], '--fault rejected-draft needs --model hybrid'),
    (['--model', 'hybrid', '--no-l3', '--fault', 'l3-wrong-checkpoint'],
     '--fault l3-wrong-checkpoint needs the L3 scenario, which this run skips: turned off (--no-l3)'),
])
def test_bad_counts_are_usage_errors(args, msg, capsys):
    from tokenspeed_lit.demo.cli import main, MAX_REQUESTS
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert msg.format(MAX_REQUESTS=MAX_REQUESTS) in err and 'usage:' in err


def test_help_describes_every_option():
    from tokenspeed_lit.demo.options import parser
    ap = parser()
    for action in ap._actions:
        assert action.help, action.option_strings
    text = ap.format_help()
    for opt in ('--ranks', '--tp', '--requests', '--seed', '--verify-width', '--fault', '--no-l3', '--l3-hosts', '--report',
                '--model'):
        assert opt in text


def test_shared_pages_are_freed_by_their_last_holder():
    from tokenspeed_lit.demo.requests import DemoConfig, Request
    from tokenspeed_lit.demo.pages import Pages
    pg = Pages(DemoConfig(), 4, 8, 'cpu')
    a, b = Request(uid=1, prompt_len=8, output_len=1, pool_row=1), Request(uid=2, prompt_len=9, output_len=1, pool_row=2)
    assert pg.ensure(a, 8)
    free = pg.pool.num_free
    pg.share(b, a.pages[:1]); assert pg.ensure(b, 9)                           # b: a's first page, then two of its own
    assert pg.pool.num_free == free - 2 and pg.alive(a.pages)
    shared, own = a.pages[0], a.pages[1]
    pg.release(a)
    assert pg.pool.num_free == free - 2 + 1 and pg.alive([shared]) and not pg.alive([own])
    pg.release(b)
    assert pg.pool.num_free == free + 2 and not pg.alive([shared])


def test_bad_ranks_from_the_environment_is_a_usage_error():
    r = subprocess.run([sys.executable, '-m', 'tokenspeed_lit.demo'], capture_output=True, text=True,
                       env={**ENV, 'RANKS': '0'}, timeout=120)
    assert r.returncode == 2 and 'argument --ranks: must be an integer in [1, 64], got 0' in r.stderr
    assert 'all checks passed' not in r.stdout


def test_a_pool_short_of_pages_does_not_deadlock():
    "Admission by pages: 16 requests on 29 usable device pages and 4 host pages all finish (admitting whenever a pool row was free stopped here: 12 prefills and 3 decodes holding every page)."
    from tokenspeed_lit.demo.requests import DemoConfig
    from tokenspeed_lit.demo.scheduler import serve
    st = serve(DemoConfig(requests=16, num_pages=30, host_pages=4, arrivals_per_step=8, max_steps=400), progress=False)
    assert st['finished'] == 16 and st['steps'] < 400

def test_every_step_is_timed_whole_from_the_outside():
    "With repeat_prep, every step's preparation is one span around the engine's call (the package holds no timer): each step with prefill rows is in prep_us, each decode step in prep_decode_us, and the hot repeats are timed too."
    from tokenspeed_lit.demo.requests import DemoConfig
    from tokenspeed_lit.demo.scheduler import serve
    st = serve(DemoConfig.for_device(requests=6, repeat_prep=True, max_steps=60), progress=False)
    assert len(st['prep_us']) == st['mixed_steps'] + st['prefill_steps']
    assert st['prep_decode_us'] and min(st['prep_us'] + st['prep_decode_us']) > 0
    assert st['prep_repeat_us'] or st['prep_decode_repeat_us']
    assert not any(k.startswith('prep_parts') or k.startswith('prep_mixed_part') for k in st)


def usage_error(args, monkeypatch, capsys) -> str:
    """`main(args)` in this process must stop with a usage error (exit code 2) within 10 s, before it prints a line or
    builds, serves or starts anything; returns what it wrote to stderr."""
    from tokenspeed_lit.demo import cli
    def started(*a, **k): raise AssertionError('the run started before its options were checked')
    for name in ('machine_line', '_run', 'serve', 'run_l3', 'run_l3_on_hosts', '_serve_ranks'):
        monkeypatch.setattr(cli, name, started)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == '' and time.monotonic() - t0 < 10, (e.value.code, out, err)
    assert 'usage:' in err
    return err


def _unwritable(tmp_path) -> str:
    "A directory this process cannot make a file in: a read-only one, or /proc for root (whom modes do not stop)."
    if os.geteuid() == 0: return '/proc'
    d = tmp_path / 'ro'; d.mkdir(); d.chmod(0o555)
    return str(d)


@pytest.mark.parametrize('kind, words', [
    ('missing dir', ['argument --report:', 'does not exist']),
    ('missing dir, trailing slash', ['argument --report:', 'is a directory']),
    ('a directory', ['argument --report:', 'is a directory']),
    ('unwritable dir', ['argument --report:', 'cannot write']),
    ('a fifo', ['argument --report:', 'not a regular file']),
    ('empty', ['argument --report:', 'empty']),
])
def test_a_report_that_cannot_be_written_is_a_usage_error(kind, words, tmp_path, monkeypatch, capsys):
    "--report is checked before the run: a traceback after the whole run lost the report."
    path = {'missing dir': str(tmp_path / 'no' / 'r.json'), 'missing dir, trailing slash': str(tmp_path / 'new') + '/',
            'a directory': str(tmp_path), 'unwritable dir': os.path.join(_unwritable(tmp_path), 'r.json'),
            'a fifo': str(tmp_path / 'fifo'), 'empty': ''}[kind]
    if kind == 'a fifo': os.mkfifo(path)          # opening it to write would block until a reader came
    err = usage_error(['--no-l3', '--report', path], monkeypatch, capsys)
    for w in words: assert w in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == (['fifo'] if kind == 'a fifo' else ['ro'] if
                                                           kind == 'unwritable dir' and os.geteuid() else [])


def test_a_writable_report_path_is_accepted_and_left_alone(tmp_path):
    from tokenspeed_lit.demo.cli import report_path_error
    assert report_path_error(str(tmp_path / 'r.json')) is None and not list(tmp_path.iterdir())
    (tmp_path / 'old.json').write_text('kept')
    assert report_path_error(str(tmp_path / 'old.json')) is None and (tmp_path / 'old.json').read_text() == 'kept'


def _few_gib(monkeypatch):
    from tokenspeed_lit.demo import cli
    monkeypatch.setattr(cli, 'host_memory_available', lambda: 3 << 30)


@pytest.mark.parametrize('args, words, setup', [
    (['--requests', str(10**12)], ['argument --requests: must be an integer in [1, '], None),
    (['--requests', '{MAX_REQUESTS_PLUS_1}'], ['argument --requests: must be an integer in [1, '], None),
    (['--ranks', '8', '--requests', '{MAX_REQUESTS}', '--no-l3'],
     ['argument --requests: --ranks 8 x --requests', 'requests per rank with --ranks 8'], None),
    (['--requests', '100000'], ['argument --requests: the L3 scenario would mount a store segment', '--no-l3'], 'l3'),
    (['--ranks', '8', '--no-l3'], ['argument --ranks: --ranks 8 x --requests', 'of host memory', 'available'], 'few GiB'),
    (['--ranks', str(10**6)], ['argument --ranks: must be an integer in [1, 64]'], None),
    (['--verify-width', str(10**6)], ['argument --verify-width: must be an integer in [1, 8]'], None),
    (['--seed', str(2**64)], ['argument --seed: must be an integer in [0, 9223372036854775807]'], None),
    ([], ['argument --ranks: must be an integer in [1, 64], got 1000000', "RANKS='1000000'"], 'RANKS'),
])
def test_what_an_option_sizes_is_bounded(args, words, setup, monkeypatch, capsys):
    """Each option that sizes something the demo allocates (requests built up front, the L3 store segment, rank
    processes) is bounded, and past its bound the run stops at once with a usage error that names the option."""
    from tokenspeed_lit.demo import cli
    if setup == 'l3': monkeypatch.setattr(cli, 'mooncake_available', lambda: True)   # the scenario would run
    if setup == 'few GiB': _few_gib(monkeypatch)
    if setup == 'RANKS': monkeypatch.setenv('RANKS', str(10**6))
    args = [a.format(MAX_REQUESTS=cli.MAX_REQUESTS, MAX_REQUESTS_PLUS_1=cli.MAX_REQUESTS + 1) for a in args]
    err = usage_error(args, monkeypatch, capsys)
    for w in words: assert w in err, err


@pytest.mark.parametrize('args, words, setup', [
    (['--fault', 'rejected-draft', '--no-l3'], ['--fault rejected-draft needs --model hybrid, got --model llama'], None),
    (['--fault', 'wrong-checkpoint', '--no-l3', '--ranks', '2'], ['--fault wrong-checkpoint needs --model hybrid'], None),
    (['--model', 'hybrid', '--no-l3', '--verify-width', '1', '--fault', 'rejected-draft'],
     ['--fault rejected-draft needs --verify-width 2, got --verify-width 1', 'no draft to reject'], None),
    # the first two requests of a rank arrive together, before any checkpoint: no prefix hit on any rank
    (['--model', 'hybrid', '--no-l3', '--requests', '2', '--fault', 'wrong-checkpoint'],
     ['--fault wrong-checkpoint needs a prefix hit, and with --requests 2 and --seed 0 none can come', 'more --requests'], None),
    (['--model', 'hybrid', '--no-l3', '--requests', '2', '--ranks', '3', '--fault', 'wrong-checkpoint'],
     ['--fault wrong-checkpoint needs a prefix hit'], None),
    (['--model', 'hybrid', '--requests', '1', '--fault', 'wrong-checkpoint'], ['--fault wrong-checkpoint needs a prefix hit'], 'l3'),
    # --seed 2: instance 1's one request starts with system prompt 1, instance 2's with system prompt 0
    (['--requests', '1', '--seed', '2', '--fault', 'l3-bad-page'],
     ['--fault l3-bad-page needs a request of the second instance that loads a page from L3',
      'with --requests 1 and --seed 2 none can', 'more --requests, or another --seed'], 'l3'),
    (['--model', 'hybrid', '--requests', '1', '--seed', '2', '--fault', 'l3-wrong-checkpoint'],
     ['--fault l3-wrong-checkpoint needs a request of the second instance that loads two pages or more from L3'], 'l3'),
    (['--fault', 'l3-bad-page', '--no-l3'], ['--fault l3-bad-page needs the L3 scenario, which this run skips: turned off'], 'l3'),
    (['--fault', 'l3-down', '--ranks', '2'], ['--fault l3-down needs the L3 scenario, which this run skips: --ranks 2'], 'l3'),
    (['--fault', 'l3-down', '--tp', '2'], ['--fault l3-down runs with --tp 1, got --tp 2'], 'l3'),
    (['--fault', 'l3-wrong-rank'], ['--fault l3-wrong-rank needs --tp 2, got --tp 1'], 'l3'),
])
def test_a_fault_that_cannot_fire_is_refused(args, words, setup, monkeypatch, capsys):
    """A fault the options cannot fire is a usage error before anything is built, naming the options: the model and
    verify width it needs, the L3 scenario, and a request mix (read from each rank's engine stream, no model built)
    with no prefix hit to spoil or no page to load from L3. `--fault rejected-draft --verify-width 1` used to run with
    no draft to reject, and a `wrong-checkpoint` run too small for a prefix hit ended 'all checks passed'."""
    from tokenspeed_lit.demo import cli
    monkeypatch.delenv('RANKS', raising=False)
    if setup == 'l3': monkeypatch.setattr(cli, 'mooncake_available', lambda: True)   # the scenario would run
    err = usage_error(args, monkeypatch, capsys)
    for w in words: assert w in err, err


def test_every_fault_is_accepted_where_it_can_fire(monkeypatch):
    "Each fault has its needs stated (`FAULTS`, in --help too) and passes check_options where they are met."
    from tokenspeed_lit.demo import cli
    monkeypatch.delenv('RANKS', raising=False)
    monkeypatch.setattr(cli, 'mooncake_available', lambda: True)
    from tokenspeed_lit.demo.options import parser, FAULTS
    ap = parser()
    assert ap._option_string_actions['--fault'].choices == ['none', *FAULTS]
    helptext = ap._option_string_actions['--fault'].help        # (the rendered help breaks names at hyphens)
    for fault, f in FAULTS.items():
        assert f['needs'] and f['outcome'] in ('caught', 'survived') and f"'{fault}' " in helptext
        cfg, skip = cli.check_options(ap, ap.parse_args(['--fault', fault, '--model', f.get('model', 'llama'),
                                                          '--tp', str(f.get('tp', 1)), '--requests', str(HYBRID_N)]))
        assert cfg.fault == fault and cfg.tp == f.get('tp', 1) and skip is None
    assert 'a run whose fault never fired fails' in helptext


@pytest.mark.parametrize('fault, fired, code, words', [
    ('stale-tail', 0, 1, ['fault                stale-tail: injected 0 times', 'FAILED: fault stale-tail never fired',
                          'it needs a step after the 5th']),
    ('stale-tail', 2, 1, ['FAILED: fault stale-tail fired 2 times and no check caught it']),
    ('l3-down', 0, 1, ['FAILED: fault l3-down never fired']),
    ('l3-down', 1, 0, ['fault                l3-down: injected 1 time', 'all checks passed']),
    ('none', 0, 0, ['all checks passed']),
])
def test_the_fault_decides_a_run_that_passed_its_checks(fault, fired, code, words, monkeypatch, capsys):
    "A run with a fault to catch passes no check of it unless the fault fired and a check stopped it; one it must survive passes only where it struck."
    from tokenspeed_lit.demo import cli
    monkeypatch.delenv('RANKS', raising=False)
    monkeypatch.setattr(cli, 'mooncake_available', lambda: True)
    monkeypatch.setattr(cli, '_run', lambda cfg, ranks, skip, on_hosts: (dict(checks=5, fault_fired=fired), dict(lines='L3 lines')))
    monkeypatch.setattr(cli, 'report', lambda stats: 'the report')
    assert cli.main(['--fault', fault, '--requests', '4']) == code
    out = capsys.readouterr().out
    for w in words: assert w in out, out
    assert ('all checks passed' in out) == (code == 0)


def test_a_fault_that_never_fired_fails_the_run(tmp_path):
    """One request of one output token (--seed 45, on the CPU's sizes and a GPU's) is done in one step, long before
    a stale tail (step 6) could be left: the run says its fault never fired and fails, and its report records 0
    injections. It used to end 'all checks passed'."""
    r = demo('--no-l3', '--requests', '1', '--seed', '45', '--fault', 'stale-tail', '--report', str(tmp_path / 'r.json'))
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'all checks passed' not in r.stdout and 'Traceback' not in r.stderr
    assert 'fault                stale-tail: injected 0 times' in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith('FAILED: fault stale-tail never fired'), r.stdout
    rep = json.loads((tmp_path / 'r.json').read_text())
    assert rep['fault_fired'] == 0 and not rep['passed'] and 'never fired' in rep['failure'] and rep['checks'] > 0
    assert rep['requests'] == 1 and rep['steps'] == 1


def test_the_requests_bound_is_what_a_request_holds():
    "MAX_REQUESTS is derived from request_bytes at the largest sizes, and a request's measured share stays under it."
    import random, tracemalloc
    from tokenspeed_lit.demo.requests import DemoConfig, request_mix
    from tokenspeed_lit.demo.cli import MAX_REQUESTS, REQUEST_BUDGET, request_bytes
    big = DemoConfig.for_device(gpu=True, verify_width=8, requests=1000)
    assert MAX_REQUESTS == REQUEST_BUDGET // request_bytes(big)
    tracemalloc.start()
    mix = request_mix(big, 0, random.Random(0))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(mix) == 1000 and held < 1000 * request_bytes(big)


def test_what_instance_2_loaded_is_the_gets_result():
    """A stale master (its store process died): the match reports every page of the prompt present, the get delivers
    only the first. The request loads that one page and prefills from there; the other pages count as failed."""
    from tokenspeed_lit.demo.requests import DemoConfig
    from tokenspeed_lit.demo.l3 import L3Plan, L3Instance
    from tokenspeed_lit.demo.scheduler import Scheduler
    from tokenspeed_lit.l3.store import OK, TRANSFER_FAIL
    from tokenspeed_lit.l3.keys import L3Namespace
    cfg = DemoConfig(requests=4, instance=2, capture_sizes=(1,))
    s, ps = Scheduler(cfg), cfg.page_size
    r = next(r for r in s.requests if (r.prompt_len - 1) // ps >= 2)
    mirror = s.host.mirror
    keys = list(L3Namespace(cfg.model_line(), mirror, salt=b'test salt').keys(r.tokens[:(r.prompt_len - 1) // ps * ps]))
    zeros = hashlib.sha256(np.zeros_like(mirror.host_pages[0].numpy())).hexdigest()

    class Handle:
        def __init__(self, op, keys, codes): self.op, self.keys, self.codes, self.released = op, keys, np.array(codes), True
        def wait(self, timeout=None): return True
        @property
        def prefix(self): return int(np.argmax(self.codes != OK)) if (self.codes != OK).any() else len(self.codes)

    class StaleTier:
        def match(self, ks): return Handle('match', list(ks), [OK] * len(ks))
        def get(self, ks, host):
            mirror.host_pages[host[0]].zero_()            # the first page arrives; the store of the others is gone
            return Handle('get', list(ks), [OK] + [TRANSFER_FAIL] * (len(ks) - 1))

    l3 = L3Instance(L3Plan('127.0.0.1:1', b'test salt'.hex(), 'get', digests={k: zeros for k in keys}, stored=keys),
                    tier=StaleTier())
    l3.bind(s)
    r.pool_row = s.free_rows.pop()
    l3.load(r)
    assert r.cache_len == r.l3_len == ps and int(s.states.valid_cache_lengths[r.pool_row]) == ps
    st = s.stats
    assert (st['l3_hit_pages'], st['l3_pages_checked'], st['l3_failed_pages']) == (1, 1, len(keys) - 1)
    assert st['l3_tokens_saved'] == ps and st['l3_tokens_recomputed'] == (len(keys) - 1) * ps


# The command line answers before the demo is imported: `demo.options` parses it (argparse only), `demo.__main__`
# imports `demo.cli` (torch, triton, transformers: seconds) only for a run.
@pytest.mark.parametrize('args, code, words', [
    (['--model', 'nope'], 2, "argument --model: invalid choice: 'nope'"),
    (['--no-such-flag'], 2, 'unrecognized arguments: --no-such-flag'),
    (['--ranks', '0'], 2, 'argument --ranks: must be an integer in [1, 64], got 0'),
    (['--help'], 0, 'DEMO_ARGS'),
])
def test_an_option_error_answers_at_once(args, code, words):
    t0 = time.time()
    r = demo(*args, timeout=60, fresh=True)            # a new interpreter, as `make demo` starts one
    took = time.time() - t0
    assert r.returncode == code and words in r.stdout + r.stderr, r.stdout + r.stderr
    assert 'make demo [RANKS=N] [DEMO_ARGS="OPTIONS"]' in r.stdout + r.stderr           # how make passes them on
    assert took < 3, f'{args}: {took:.2f} s'                                              # torch alone takes seconds


def test_the_options_are_parsed_without_torch():
    code = ("import sys; from tokenspeed_lit.demo.options import parse; ap, a = parse(['--model', 'hybrid', '--fault', "
            "'rejected-draft']); print(a.model, a.fault, [m for m in ('torch', 'triton', 'transformers', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=ENV, timeout=60, check=True).stdout
    assert out.split() == ['hybrid', 'rejected-draft', '[]'], out


def test_make_help_names_demo_args_and_ranks():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(['make', '-s', '-C', root, 'STAMP=', 'help'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    demo_lines = [l for l in r.stdout.splitlines() if l.startswith('make demo')]
    assert any('DEMO_ARGS="--model hybrid"' in l and 'RANKS=' in l for l in demo_lines), r.stdout
    assert any('DEMO_ARGS="--tp 2"' in l and 'tensor-parallel' in l for l in demo_lines), r.stdout
    assert all(l.startswith('make ') for l in r.stdout.splitlines())                   # one line a target


def test_the_one_time_setup_is_announced_first(tmp_path):
    "The first run of a target (a missing stamp) says what it sets up and its size before it installs anything."
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(['make', '-n', '-C', root, f'STAMP={tmp_path}/.installed', 'demo'], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert 0 <= out.index('one-time setup') < out.index('pip install'), out
    said = next(l for l in out.splitlines() if 'one-time setup' in l)
    assert 'requirements-dev.txt' in said and 'GB' in said


def test_the_summary_and_report_label_interpreter_timings(monkeypatch, capsys, tmp_path):
    "Without a GPU's compiled kernels the summary says its timings are the interpreter's, and the JSON report carries it (`timings_note`)."
    from tokenspeed_lit.demo import cli
    monkeypatch.delenv('RANKS', raising=False)
    monkeypatch.setattr(cli, '_run', lambda cfg, ranks, skip, on_hosts: (dict(checks=5, fault_fired=0),
                                                                         dict(lines='L3 lines', json=None)))
    monkeypatch.setattr(cli, 'report', lambda stats: 'the report')
    assert cli.main(['--requests', '4', '--no-l3', '--report', str(tmp_path / 'r.json')]) == 0
    out, rep = capsys.readouterr().out, json.loads((tmp_path / 'r.json').read_text())
    assert out.index('setup: the model is built here') < out.index('the report')
    if triton_interpreted():
        assert 'timings              Triton interpreter figures (TRITON_INTERPRET=1, ' in out, out
        assert rep['timings_note'].endswith('not representative of a GPU') and rep['timings_note'] in out
    else: assert rep['timings_note'] is None and 'interpreter figures' not in out
