"""`make demo` at its CPU defaults, one rank and two (gloo), plus fault injection: the checks must catch a stale
padded tail, a write into a free page and a wrong page in a request's history (through its logits), exit non-zero,
and name the request, position and slot."""
import os, subprocess, sys
import pytest

ENV = {**os.environ, 'PYTHONUNBUFFERED': '1'}


def demo(*args, timeout=600):
    return subprocess.run([sys.executable, '-m', 'tokenspeed_lit.demo', *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


@pytest.mark.parametrize('ranks', [1, 2])
def test_demo_passes_every_check(ranks):
    # one rank: `make demo` at its CPU default (64 requests; on a GPU too, so that `make test-gpu` keeps its time)
    r = demo('--ranks', str(ranks), '--requests', '24' if ranks > 1 else '64')
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'all checks passed' in r.stdout
    assert f'ranks                {ranks}' in r.stdout
    line = lambda start: next(l for l in r.stdout.splitlines() if l.startswith(start))
    assert int(line('requests finished').split()[2].rstrip(',')) > 0
    assert "each output equal to generate's" in line('requests finished')
    logits, kv = line('logits compared').split(), line('KV compared').split()
    assert int(logits[2]) > 0 and int(kv[2]) > 0
    tol = float(logits[logits.index('(tolerance') + 1].rstrip(');'))
    assert float(logits[logits.index('|difference|') + 1]) <= tol and float(kv[kv.index('|difference|') + 1]) <= tol
    for words in ('graph replays', 'offloads', 'single-token verifies', 'model: transformers Llama', 'transformers 5.'):
        assert words in r.stdout
    # not a terminal: the progress bar writes plain lines, one per tenth of the requests, no carriage returns
    assert '\r' not in r.stderr
    assert 1 <= sum('requests finished' in l for l in r.stderr.splitlines()) <= 10, r.stderr


@pytest.mark.parametrize('fault, ranks, words', [
    ('stale-tail', 1, ['out_cache_loc_buf', 'padding', 'slot', '= request', 'position']),
    ('stray-write', 2, ['slot', 'owned by no request']),
    ('wrong-page', 1, ['logits of request', 'at position', 'slot', "differ from transformers'", 'tolerance']),
])
def test_demo_catches_injected_faults(fault, ranks, words):
    r = demo('--fault', fault, '--ranks', str(ranks), '--requests', '16')
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if 'VIOLATION' in l)
    for w in words: assert w in line, line


@pytest.mark.parametrize('args, msg', [
    (['--ranks', '0'], 'argument --ranks: must be an integer in [1, 64], got 0'),
    (['--ranks', 'two'], "argument --ranks: 'two' is not an integer"),
    (['--requests', '0'], 'argument --requests: must be an integer >= 1, got 0'),
    (['--requests', '-3'], 'argument --requests: must be an integer >= 1, got -3'),
    (['--seed', '-1'], 'argument --seed: must be an integer >= 0, got -1'),
    (['--verify-width', '0'], 'argument --verify-width: must be an integer in [1, 8], got 0'),
    (['--fault', 'boom'], "argument --fault: invalid choice: 'boom'"),
])
def test_bad_counts_are_usage_errors(args, msg, capsys):
    from tokenspeed_lit.demo import main
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert msg in err and 'usage:' in err


def test_help_describes_every_option():
    from tokenspeed_lit.demo import parser
    ap = parser()
    for action in ap._actions:
        assert action.help, action.option_strings
    text = ap.format_help()
    for opt in ('--ranks', '--requests', '--seed', '--verify-width', '--fault'):
        assert opt in text


def test_bad_ranks_from_the_environment_is_a_usage_error():
    r = subprocess.run([sys.executable, '-m', 'tokenspeed_lit.demo'], capture_output=True, text=True,
                       env={**ENV, 'RANKS': '0'}, timeout=120)
    assert r.returncode == 2 and 'argument --ranks: must be an integer in [1, 64], got 0' in r.stderr
    assert 'all checks passed' not in r.stdout
