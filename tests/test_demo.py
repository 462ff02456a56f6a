"""`make demo` at its CPU defaults, one rank and two (gloo), plus fault injection: the checks must catch a stale
padded tail and a write into a free page, exit non-zero, and name the request, position and slot."""
import os, subprocess, sys
import pytest

ENV = {**os.environ, 'PYTHONUNBUFFERED': '1'}


def demo(*args, timeout=600):
    return subprocess.run([sys.executable, '-m', 'tokenspeed_lit.demo', *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


@pytest.mark.parametrize('ranks', [1, 2])
def test_demo_passes_every_check(ranks):
    r = demo('--ranks', str(ranks))
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'all checks passed' in r.stdout
    assert f'ranks                {ranks}' in r.stdout
    finished = int(next(l for l in r.stdout.splitlines() if l.startswith('requests finished')).split()[-1])
    assert finished > 0
    for line in ('graph replays', 'offloads', 'single-token verifies'):
        assert line in r.stdout


@pytest.mark.parametrize('fault, ranks, words', [
    ('stale-tail', 1, ['out_cache_loc_buf', 'padding', 'slot', '= request', 'position']),
    ('stray-write', 2, ['slot', 'owned by no request']),
])
def test_demo_catches_injected_faults(fault, ranks, words):
    r = demo('--fault', fault, '--ranks', str(ranks), '--requests', '16')
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if 'VIOLATION' in l)
    for w in words: assert w in line, line
