"""The L3 tier against real Mooncake servers (issue 26, item 4): byte-exact round trips on every pool layout, a
second engine process, tenant/layout isolation, a master killed and restarted, deadlines and late completions, a
full queue, quarantine, and the package without Mooncake."""
import json, os, signal, subprocess, sys, time
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.tiers.host_mirror import FlatHostMirror
from tokenspeed_lit.l3.keys import L3Namespace
from tokenspeed_lit.core.streams import synchronize
from tokenspeed_lit.l3.tier import L3Tier
from tokenspeed_lit.l3.store import (MooncakeStore, OK, MISS, TIMEOUT, REFUSED, DOWN, SKIPPED, TRANSFER_FAIL, RPC_FAIL,
                                     SAFE_CODES)
from l3_servers import mooncake, shared_mooncake, mooncake_missing  # noqa: F401  (fixtures)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = {'per-layer': dict(), 'slab': dict(layers_per_slab=2), 'hybrid': dict(layers_per_slab=2, state_layers=(1,)),
           'hybrid-per-layer': dict(state_layers=(0, 3))}


def engine(layout='hybrid', seed=0, host_pages=24, page_size=4, salt=b'tenant', model='m@1', heads=2, head_dim=8,
           **ns_kw):
    "A pool of random KV in `layout`, its mirror with device page p stored in host page p, and a namespace."
    pool = PagedKVPool(num_pages=host_pages, page_size=page_size, num_layers=4, num_kv_heads=heads,
                       head_dim=head_dim, **LAYOUTS[layout])
    g = torch.Generator().manual_seed(seed)
    mirror = FlatHostMirror(pool, num_host_pages=host_pages)
    for dt, _ in mirror.tensor_pairs:
        b = dt.view(torch.uint8)
        b.copy_(torch.randint(0, 256, b.shape, generator=g, dtype=torch.uint8))
    mirror.store_pages([(p, p) for p in range(host_pages)]); synchronize()   # queued on the mirror's streams
    return pool, mirror, L3Namespace(model, mirror, salt=salt, **ns_kw)


def u8(t): return t.contiguous().view(torch.uint8)   # bytes: random bits hold NaNs


def tokens(seed, n):
    return torch.randint(0, 50_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


pytestmark = mooncake_missing


def freeze(proc):
    "SIGSTOP `proc` and wait until the kernel shows it stopped (the signal is delivered asynchronously: under load a request sent at once could still be served)."
    os.kill(proc.pid, signal.SIGSTOP)
    for _ in range(2000):
        with open(f'/proc/{proc.pid}/stat') as f: state = f.read().rsplit(')', 1)[1].split()[0]
        if state in ('T', 't'): return
        time.sleep(0.001)
    raise AssertionError(f'process {proc.pid} not stopped 2 s after SIGSTOP (state {state})')

def settle(tier, keys, tries=100):
    "A match, retried while the tier's circuit is open (a store that just came back is probed first)."
    for _ in range(tries):
        m = tier.match(keys); m.wait(10)
        if DOWN not in m.codes: return m
        time.sleep(0.05)
    return m


@pytest.mark.parametrize('layout', sorted(LAYOUTS))
def test_round_trip_byte_exact_every_layout(shared_mooncake, layout):
    pool, mirror, ns = engine(layout, seed=hash(layout) % 1000)
    with L3Tier(mirror, MooncakeStore(shared_mooncake.master), ns, max_batch_pages=3) as tier:
        req = tokens(1, 4 * 9 + 2)                           # nine full pages, a partial tenth
        src = torch.arange(1, 10)
        h = tier.put_tokens(req, src)
        assert h.wait(10) and h.ok.all() and h.n == 9
        assert h.wait_released(10) and not tier.held().any()
        expect = mirror.host_pages[src].clone()
        mirror.host_pages[10:19] = 0
        g = tier.get(ns.keys(req), np.arange(10, 19))
        assert g.wait(10) and g.ok.all() and g.prefix == 9
        assert torch.equal(mirror.host_pages[10:19], expect)
        # host -> device: every mirrored tensor's rows of those pages equal the originals
        mirror.load_pages([(20 + i, 10 + i) for i in range(3)])
        for dt, host in mirror.tensor_pairs:
            span = dt.shape[0] // pool.num_pages
            for i in range(3):
                assert torch.equal(u8(dt[(20 + i) * span:(21 + i) * span]), u8(dt[(1 + i) * span:(2 + i) * span]))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_page_sets_match_and_get(shared_mooncake, data):
    "Random requests sharing random prefixes, random host page sets: match/get agree with a plain model."
    pool, mirror, ns = engine('slab', seed=7, host_pages=32, salt=os.urandom(8))   # a fresh namespace per example
    base = tokens(data.draw(st.integers(0, 10**6)), 4 * 8)
    stored = data.draw(st.integers(0, 8))                   # pages of `base` put to L3
    with L3Tier(mirror, MooncakeStore(shared_mooncake.master), ns, max_batch_pages=data.draw(st.integers(1, 5))) as tier:
        src = np.array(data.draw(st.permutations(range(32)))[:stored], np.int64)
        if stored:
            h = tier.put(src, ns.keys(base[:4 * stored])); assert h.wait(10) and h.ok.all(); h.wait_released(10)
        share = data.draw(st.integers(0, 32))               # a second request: shares `share` tokens of base
        other = base[:share] + [50_001 + i for i in range(32 - share)]
        expect_prefix = min(stored, share // 4)
        m = tier.match(ns.keys(other)); assert m.wait(10)
        assert m.prefix == expect_prefix
        assert set(m.codes[expect_prefix:].tolist()) <= {MISS, SKIPPED}
        free = [p for p in range(32) if p not in set(src.tolist())]
        dst = np.array(data.draw(st.permutations(free))[:8], np.int64)
        g = tier.get(ns.keys(other)[:len(dst)], dst); assert g.wait(10)
        assert g.prefix == min(expect_prefix, len(dst))
        for i in range(g.prefix): assert torch.equal(mirror.host_pages[dst[i]], mirror.host_pages[src[i]])


_HOLDS = {}        # master -> (keys, tier): one tier for every example (a Mooncake client takes seconds to set up)


class _NoWorkers(L3Tier):
    "A tier whose worker thread returns at once (a public tier needs `workers >= 1`): the test completes calls itself."
    def _work(self): return


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_holds_follow_a_plain_model(shared_mooncake, data):
    """Puts and gets on random host pages, held while in flight: which calls raise 'still held', which pages `held`
    reports, before and after each call completes (some with answers that quarantine pages), against a plain model
    (a get holds its pages alone; puts may share theirs, each holding until it returns; a quarantined page stays
    held the way its call held it). A tier whose worker never runs keeps every call queued until the test completes it, the
    oldest first, the way a worker would."""
    if shared_mooncake.master not in _HOLDS:
        _, mirror, ns = engine('per-layer', seed=3, host_pages=12)
        _HOLDS.clear()
        _HOLDS[shared_mooncake.master] = ns.keys(tokens(9, 4 * 12)), _NoWorkers(mirror, MooncakeStore(shared_mooncake.master), ns, workers=1)
    keys, tier = _HOLDS[shared_mooncake.master]
    tier.batch_pages = data.draw(st.integers(1, 4))
    live, quarantined = [], {}                           # (op, pages, handle) queued in order; page -> op
    def held_model():
        return {p for _, pages, _ in live for p in pages} | set(quarantined)
    def complete(op, pages, h, unsafe=()):               # every batch of the oldest call, in order, as a worker would
        with tier._cv:
            while tier._queue and tier._queue[0] is h:
                b = tier._next_batch()
                codes = [TRANSFER_FAIL if pages[i] in unsafe else OK for i in range(b.lo, b.hi)]
                tier._finish(b, codes)
        assert h.done and h.released == (not unsafe) and sorted(h.held_pages.tolist()) == sorted(unsafe)
    try:
        for _ in range(data.draw(st.integers(1, 14))):
            if live and data.draw(st.booleans()):
                op, pages, h = live.pop(0)
                unsafe = set(data.draw(st.lists(st.sampled_from(pages), max_size=2))) if data.draw(st.booleans()) else set()
                complete(op, pages, h, unsafe)
                quarantined.update({p: op for p in unsafe})
            else:
                op = data.draw(st.sampled_from(['put', 'get']))
                pages = data.draw(st.lists(st.integers(0, 11), min_size=1, max_size=5, unique=True))
                held_by = [(o, p) for o, ps, _ in live for p in ps] + [(o, p) for p, o in quarantined.items()]
                busy = {p for o, p in held_by if op == 'get' or o == 'get'}    # puts may share with puts
                call = (lambda: tier.put(np.array(pages), keys[:len(pages)])) if op == 'put' else \
                       (lambda: tier.get(keys[:len(pages)], np.array(pages)))
                if busy & set(pages):
                    with pytest.raises(ValueError, match='still held'): call()
                else:
                    h = call(); assert not h.done and sorted(h.held_pages.tolist()) == sorted(pages)
                    live.append((op, pages, h))
            assert set(np.flatnonzero(tier.held()).tolist()) == held_model()
        assert tier.release_quarantine() == sorted(quarantined)
        quarantined.clear()
        assert set(np.flatnonzero(tier.held()).tolist()) == held_model()
    finally:                                              # leave the tier empty for the next example
        with tier._cv:
            while tier._queue:
                b = tier._next_batch(); tier._finish(b, [OK] * (b.hi - b.lo))
        tier.release_quarantine()
    assert not tier.held().any() and not tier._queue


SECOND = '''
import sys, json, numpy as np, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from test_l3 import engine, tokens
from tokenspeed_lit.l3.tier import L3Tier
from tokenspeed_lit.l3.store import MooncakeStore
pool, mirror, ns = engine('hybrid', seed=99, salt={salt!r})       # another instance: other KV in its own pool
mirror.host_pages.zero_()
with L3Tier(mirror, MooncakeStore({master!r}), ns) as tier:
    m = tier.match(ns.keys(tokens(5, 40))); m.wait(10)
    g = tier.get_tokens(tokens(5, 40), np.arange(12, 22)); g.wait(10)
    mirror.load_pages([(p, 12 + p) for p in range(g.prefix)])            # L3 -> host -> its own device pool
    dev = [dt[:g.prefix * (dt.shape[0] // pool.num_pages)].cpu().contiguous().view(torch.uint8).numpy().tobytes().hex()
           for dt, _ in mirror.tensor_pairs]
    print(json.dumps(dict(matched=m.prefix, prefix=g.prefix, dev=dev)))
'''


def test_second_process_matches_and_gets(shared_mooncake):
    pool, mirror, ns = engine('hybrid', seed=3)
    with L3Tier(mirror, MooncakeStore(shared_mooncake.master), ns) as tier:
        h = tier.put_tokens(tokens(5, 40)[:4 * 6], np.arange(2, 8))   # six of its ten pages
        assert h.wait(10) and h.ok.all()
        out = {}
        for salt in (b'tenant', b'another tenant'):
            code = SECOND.format(root=ROOT, tests=os.path.join(ROOT, 'tests'), salt=salt, master=shared_mooncake.master)
            r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr[-3000:]
            out[salt] = json.loads(r.stdout.strip().splitlines()[-1])
        assert out[b'tenant']['matched'] == out[b'tenant']['prefix'] == 6
        assert out[b'another tenant']['matched'] == out[b'another tenant']['prefix'] == 0
        for (dt, _), hexed in zip(mirror.tensor_pairs, out[b'tenant']['dev']):   # its device KV = ours
            span = dt.shape[0] // pool.num_pages
            assert bytes.fromhex(hexed) == dt[2 * span:8 * span].cpu().contiguous().view(torch.uint8).numpy().tobytes()


def test_tenants_layouts_ranks_models_isolated(shared_mooncake):
    req = tokens(11, 4 * 5)
    pool, mirror, ns = engine('hybrid', seed=1)
    with L3Tier(mirror, MooncakeStore(shared_mooncake.master), ns) as tier:
        assert tier.put_tokens(req, np.arange(5)).wait(10)
        others = [engine('hybrid', salt=b'tenant-2'), engine('slab'), engine('hybrid', page_size=8),
                  engine('hybrid', tp_rank=1, tp_size=2), engine('hybrid', model='m@2')]
        for _, m2, ns2 in others:
            with L3Tier(m2, MooncakeStore(shared_mooncake.master), ns2) as t2:
                m = t2.match(ns2.keys(req)); assert m.wait(10) and m.prefix == 0
                g = t2.get_tokens(req, np.arange(5)); assert g.wait(10) and g.prefix == 0
        m = tier.match(ns.keys(req)); assert m.wait(10) and m.prefix == 5


def test_bad_input_moves_nothing(shared_mooncake):
    pool, mirror, ns = engine('per-layer')
    with L3Tier(mirror, MooncakeStore(shared_mooncake.master), ns) as tier:
        keys = ns.keys(tokens(2, 16))
        before = mirror.host_pages.clone()
        cases = [(lambda: tier.get(keys[:2], [0, 24]), ValueError, 'out of range'),
                 (lambda: tier.get(keys[:2], [-1, 0]), ValueError, 'out of range'),
                 (lambda: tier.get(keys[:2], [5, 5]), ValueError, 'appears twice'),
                 (lambda: tier.put([5, 5], keys[:2]), ValueError, 'appears twice'),
                 (lambda: tier.put([1, 2, 3], keys[:2]), ValueError, '2 keys for 3 host pages'),
                 (lambda: tier.get([k.encode() for k in keys[:1]], [1]), TypeError, 'keys must be str'),
                 (lambda: tier.match(iter(keys)), TypeError, 'keys must be a list'),
                 (lambda: tier.match(['tsl3/0123456789abcdef/' + '0' * 64]), ValueError, 'not of this tier'),
                 (lambda: tier.get(keys[:1], torch.tensor([1.0])), TypeError, '1-D integers')]
        # Keys the namespace made skip the key-by-key check; once edited to hold another namespace's key they do not.
        edited, foreign = ns.keys(tokens(2, 16)), engine('per-layer', salt=b'other tenant')[2].keys(tokens(2, 16))
        edited.append(foreign[0]); cases.append((lambda: tier.put([1, 2, 3, 4, 5], edited), ValueError, 'not of this tier'))
        edited2 = ns.keys(tokens(2, 16)); edited2[1] = foreign[1]
        cases.append((lambda: tier.get(edited2, [1, 2, 3, 4]), ValueError, 'not of this tier'))
        cases.append((lambda: tier.match(foreign[:2]), ValueError, 'not of this tier'))   # another namespace's own list
        for f, exc, msg in cases:
            with pytest.raises(exc, match=msg): f()
        assert tier.stats['calls'] == 0 and not tier.held().any()
        assert torch.equal(mirror.host_pages, before)
        with pytest.raises(ValueError, match='another KV layout'): L3Tier(engine('slab')[1], tier.store, ns)
        with pytest.raises(ValueError, match='exceeds max_queued_pages'):
            L3Tier(mirror, tier.store, ns, max_queued_pages=2).match(keys)


def test_master_killed_mid_run_and_restarted(mooncake):
    pool, mirror, ns = engine('hybrid', host_pages=64)
    req = tokens(4, 4 * 60)
    with L3Tier(mirror, MooncakeStore(mooncake.master), ns, timeout_s=0.5, max_batch_pages=4) as tier:
        assert tier.put_tokens(req[:40], np.arange(10)).wait(10)
        handles = [tier.put_tokens(req, np.arange(60)), tier.match(ns.keys(req))]
        mooncake.kill_master()                                      # mid-run: some batches done, others not
        t0 = time.monotonic()
        for h in handles: assert h.wait(3)
        assert time.monotonic() - t0 < 2.5                          # within a deadline or two, not 4 s per batch
        put = handles[0]
        assert set(put.codes.tolist()) <= {OK, DOWN, TIMEOUT, RPC_FAIL}
        assert put.wait_released(15) and not tier.held().any()
        t0 = time.monotonic()
        m = tier.match(ns.keys(req)); assert m.wait(1)              # while down: refused at once or probed
        assert m.prefix == 0 and time.monotonic() - t0 < 1
        mooncake.restart()                                          # a new master and store process, same address
        for _ in range(100):
            m = tier.match(ns.keys(req)); m.wait(5)
            if m.codes[0] == MISS: break
            time.sleep(0.05)
        assert m.codes[0] == MISS and tier.stats['recoveries'] >= 1
        h = tier.put_tokens(req, np.arange(60)); assert h.wait(10) and h.ok.all()
        m = tier.match(ns.keys(req)); assert m.wait(10) and m.prefix == 60


def test_deadline_holds_pages_until_late_completion(mooncake):
    "A stopped master: the get completes at its deadline as failed, its pages stay held until the store returns."
    pool, mirror, ns = engine('slab')
    _, mirror2, ns2 = engine('slab', seed=5)                     # a second instance (its own client: no cache)
    req = tokens(8, 4 * 6)
    with L3Tier(mirror, MooncakeStore(mooncake.master), ns) as tier, \
         L3Tier(mirror2, MooncakeStore(mooncake.master), ns2, timeout_s=0.3, probe_interval_s=0.05) as tier2:
        assert tier.put_tokens(req, np.arange(6)).wait(10)
        good, before = mirror.host_pages[:6].clone(), mirror2.host_pages[10:16].clone()
        try:
            freeze(mooncake.master_proc)
            t0 = time.monotonic()
            g = tier2.get_tokens(req, np.arange(10, 16))
            assert g.wait(3) and time.monotonic() - t0 < 1.5
            assert set(g.codes.tolist()) == {TIMEOUT} and not g.ok.any()
            assert sorted(g.held_pages.tolist()) == list(range(10, 16)) and tier2.held(np.arange(10, 16)).all()
            with pytest.raises(ValueError, match='still held'): tier2.get(ns2.keys(req)[:1], [10])
            with pytest.raises(ValueError, match='still held'): tier2.put([10], ns2.keys(req)[:1])
            d = tier2.match(ns2.keys(req)); assert d.wait(1) and set(d.codes.tolist()) == {DOWN}   # circuit open
        finally: os.kill(mooncake.master_proc.pid, signal.SIGCONT)
        assert g.wait_released(40)                                  # the late completion releases them
        assert (g.codes == TIMEOUT).all() and tier2.stats['late'] >= 1   # ...but never reports them loaded
        landed = [torch.equal(mirror2.host_pages[10 + i], good[i]) for i in range(6)]   # the late get landed its bytes,
        assert all(landed) or torch.equal(mirror2.host_pages[10:16], before)  # or the stuck call was the routing question: nothing sent
        for _ in range(100):                                        # the circuit closes on a probe
            m = tier2.match(ns2.keys(req)); m.wait(5)
            if m.prefix == 6: break
            time.sleep(0.05)
        assert m.prefix == 6


def test_full_queue_refuses_puts_at_once(mooncake):
    pool, mirror, ns = engine('per-layer', host_pages=64)
    req = tokens(9, 4 * 64)
    keys = ns.keys(req)
    with L3Tier(mirror, MooncakeStore(mooncake.master), ns, timeout_s=20, max_batch_pages=2, workers=1,
                max_queued_pages=16) as tier:
        try:
            freeze(mooncake.master_proc)
            first = tier.put(np.arange(0, 2), keys[0:2])            # the worker blocks on it
            time.sleep(0.2)
            queued = tier.put(np.arange(2, 18), keys[2:18])         # fills the queue (16 pages)
            t0 = time.monotonic()
            refused = tier.put(np.arange(18, 20), keys[18:20])
            assert refused.done and time.monotonic() - t0 < 0.05   # refused at once, not blocking
            assert set(refused.codes.tolist()) == {REFUSED} and refused.released
            assert not tier.held(np.arange(18, 20)).any() and tier.stats['refused'] == 1
            assert not queued.done and tier.held(np.arange(2, 18)).all()
        finally: os.kill(mooncake.master_proc.pid, signal.SIGCONT)
        assert first.wait(30) and queued.wait(30) and first.ok.all() and queued.ok.all()
        assert settle(tier, keys[:16]).prefix == 16 and settle(tier, keys[16:20]).prefix == 2


def test_store_process_killed_mid_get_quarantines(mooncake):
    "A transfer that fails (-800) may still be in flight: its pages stay held until release_quarantine."
    pool, mirror, ns = engine('per-layer', host_pages=48, page_size=16, heads=8, head_dim=64)   # 512 KiB pages
    _, mirror2, ns2 = engine('per-layer', host_pages=48, page_size=16, heads=8, head_dim=64, seed=1)
    req = tokens(12, 16 * 40)
    with L3Tier(mirror, MooncakeStore(mooncake.master), ns) as tier, \
         L3Tier(mirror2, MooncakeStore(mooncake.master), ns2, timeout_s=5) as tier2:
        assert tier.put_tokens(req, np.arange(40)).wait(20)
        g = tier2.get_tokens(req, np.arange(40))
        mooncake.store_proc.kill()                                  # the memory holding the objects goes away
        assert g.wait(20)
        failed = g.host_pages[g.codes != OK].tolist()
        unsafe = g.host_pages[[c not in SAFE_CODES for c in g.codes]].tolist()
        assert failed, 'the store process died after the get finished: nothing to check'
        assert tier2.quarantined() == sorted(unsafe)
        assert tier2.held(unsafe).all() if unsafe else True
        assert set(failed) - set(unsafe) == set(failed) - set(tier2.quarantined())
        assert not tier2.held(sorted(set(g.host_pages.tolist()) - set(unsafe))).any()
        assert tier2.release_quarantine() == sorted(unsafe) and not tier2.held().any()
        print('codes', sorted(set(g.codes.tolist())), 'quarantined', len(unsafe))


def test_package_without_mooncake():
    "Mooncake hidden: every module imports, the mirror and the keys work, MooncakeStore says how to install."
    code = f'''
import sys; sys.modules['mooncake'] = None; sys.modules['mooncake.store'] = None
sys.path.insert(0, {ROOT!r})
import importlib, pkgutil, tokenspeed_lit
for m in pkgutil.walk_packages(tokenspeed_lit.__path__, 'tokenspeed_lit.'):
    if m.name not in ('tokenspeed_lit.demo.cli', 'tokenspeed_lit.demo.__main__'): importlib.import_module(m.name)
from tokenspeed_lit.l3.store import MooncakeStore, mooncake_available
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.tiers.host_mirror import FlatHostMirror
from tokenspeed_lit.l3.keys import L3Namespace
assert not mooncake_available()
pool = PagedKVPool(num_pages=4, page_size=2, num_layers=2, num_kv_heads=1, head_dim=4)
pool.k_buffer[0].fill_(3); m = FlatHostMirror(pool, 4); m.store_pages([(1, 2)])
from tokenspeed_lit.core.streams import synchronize; synchronize()     # the store is queued: the host reads next
assert (m.tensor_pairs[0][1][2] == 3).all()
assert len(L3Namespace('m', m, salt=b's').keys(list(range(8)))) == 4
try: MooncakeStore('127.0.0.1:1'); raise SystemExit('no error')
except ImportError as e: assert "pip install -e '.[l3]'" in str(e), e
print('ok')
'''
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith('ok'), r.stderr[-3000:]


def test_no_server_outlives_stop():
    from tokenspeed_lit.l3.servers import LocalMooncake
    srv = LocalMooncake(segment_bytes=16 << 20)
    pids = srv.pids
    assert len(pids) == 2
    srv.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError): os.kill(pid, 0)


def test_asking_for_mooncake_loads_nothing_here():
    "Whether Mooncake is there is asked of a new interpreter: the asking process loads nothing and starts no thread (the demo forks its ranks and instances from it), which loading Mooncake would."
    code = f'''
import os, sys
sys.path.insert(0, {ROOT!r})
from tokenspeed_lit.l3.store import mooncake_available
threads = lambda: len(os.listdir('/proc/self/task'))
n = threads()
assert mooncake_available() is True
assert 'mooncake.store' not in sys.modules and threads() == n, (n, threads())
from mooncake.store import MooncakeDistributedStore
assert threads() > n, (n, threads())                      # loading it starts threads
assert mooncake_available() is True
print('ok')
'''
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith('ok'), r.stdout + r.stderr[-3000:]
