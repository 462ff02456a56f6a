"""What the L3 tier refuses and how its waits and lifetimes end, against real Mooncake servers: keys that name one
object twice, keys the namespace itself rejects (the tier's fast check against `L3Namespace.owns` on random
mutations), calls on a closed store or under a closing tier, masters that accept and never answer, and every
argument checked by name before anything starts: every setup value bounded and named by its source (the keyword, the
config key, the environment variable), metadata servers that never answer failing by the deadline, and config paths
that do not name a JSON file refused naming the path."""
import os, re, signal, socket, subprocess, threading, time
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from tokenspeed_lit.l3.tier import L3Tier
from tokenspeed_lit.l3.servers import LocalMooncake
from tokenspeed_lit.l3.store import MooncakeStore, OK, TIMEOUT, DOWN, size_bytes, check_master, check_metadata_server, ram_bytes
from tokenspeed_lit.l3.keys import L3Keys, L3Namespace, layout_fingerprint
from test_l3 import engine, tokens, freeze
from l3_servers import mooncake, shared_mooncake, mooncake_missing  # noqa: F401  (fixtures)

pytestmark = mooncake_missing


@pytest.fixture(scope='module')
def tier(shared_mooncake):
    "One tier for the argument tables (a client takes a second or two to set up)."
    pool, mirror, ns = engine('per-layer', host_pages=16)
    with L3Tier(mirror, MooncakeStore(shared_mooncake.master), ns) as t:
        yield t


def refused(t, f, exc, msg):
    "`f()` raises `exc` naming `msg`, and neither holds a page nor counts a call nor changes a host byte."
    calls, before = t.stats['calls'], t.mirror.host_pages.clone()
    with pytest.raises(exc, match=msg): f()
    assert t.stats['calls'] == calls and not t.held().any()
    assert torch.equal(t.mirror.host_pages, before)


# ---- 1. one call names each key once ("loaded" means "these bytes were written") ----

def test_raw_store_answers_a_repeated_key_with_one_transfer(tier):
    "Why the tier refuses repeated keys: Mooncake reports both pages of `get([k, k], [a, b])` read, and writes one."
    store, buf, pb = tier.store, tier.mirror.host_pages, tier.page_bytes
    k = tier.namespace.keys(tokens(31, 4))[0]
    buf[1] = 7; buf[2] = 0; buf[3] = 0
    assert store.batch_put_from([k], buf, [pb], [pb]) == [0]
    codes = store.batch_get_into([k, k], buf, [2 * pb, 3 * pb], [pb, pb])
    written = [bool((buf[p] == 7).all()) for p in (2, 3)]
    assert codes == [pb, pb] and written.count(True) == 1, (codes, written)


def _dups(ns):
    ks = ns.keys(tokens(40, 4 * 6))
    rep = ns.keys(tokens(40, 4 * 3)); rep *= 2                      # an L3Keys repeated in place
    return {'adjacent': [ks[0], ks[0]], 'apart': [ks[0], ks[1], ks[2], ks[0]], 'copies': list(ks[:2]) + list(ks[1:3]),
            'in-place *=': rep}


@pytest.mark.parametrize('case', ['adjacent', 'apart', 'copies', 'in-place *='])
@pytest.mark.parametrize('op', ['put', 'get', 'match'])
def test_repeated_keys_refused(tier, op, case):
    keys = _dups(tier.namespace)[case]
    pages = np.arange(4, 4 + len(keys))
    f = {'put': lambda: tier.put(pages, keys), 'get': lambda: tier.get(keys, pages), 'match': lambda: tier.match(keys)}[op]
    refused(tier, f, ValueError, r'keys\[\d+\] and keys\[\d+\] are the same key')


def test_repeated_host_pages_and_tokens_refused(tier):
    keys = tier.namespace.keys(tokens(41, 4 * 3))
    refused(tier, lambda: tier.get(keys, [5, 6, 5]), ValueError, 'page 5 appears twice')
    refused(tier, lambda: tier.put(np.array([7, 7, 8]), keys), ValueError, 'page 7 appears twice')
    refused(tier, lambda: tier.get_tokens(tokens(41, 4 * 3), [9, 9, 10]), ValueError, 'page 9 appears twice')


# ---- 5. keys: the fast check accepts exactly what the namespace owns ----

def _mutate(ns, key, how, draw):
    body = key[len(ns.prefix):]
    i = draw(st.integers(0, 63))
    return {'upper': ns.prefix + body[:i] + body[i].upper() + body[i + 1:],
            'non-hex': ns.prefix + body[:i] + draw(st.sampled_from('gxz-_ /')) + body[i + 1:],
            'short': key[:-1 - i % 8], 'long': key + body[:1 + i % 8],
            'unicode': ns.prefix + body[:i] + 'é' + body[i + 1:],
            'prefix': 'tsl3/' + '0' * 16 + '/' + body, 'ok': key}[how]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fast_key_check_agrees_with_owns(tier, data):
    "Random lists of keys, some mutated (case, non-hex, lengths that cancel out, another prefix): the tier accepts a list iff `owns` accepts every key and none repeats."
    ns = tier.namespace
    base = ns.keys(tokens(data.draw(st.integers(0, 10**6)), 4 * 6))
    hows = data.draw(st.lists(st.sampled_from(['ok'] * 4 + ['upper', 'non-hex', 'short', 'long', 'unicode', 'prefix']),
                              min_size=1, max_size=6))
    keys = [_mutate(ns, base[i], h, data.draw) for i, h in enumerate(hows)]
    if data.draw(st.booleans()) and len(keys) > 1:                # a pair of mutations whose lengths cancel out
        keys[0], keys[-1] = base[0][:-3], base[len(keys) - 1] + 'abc'
    good = all(ns.owns(k) for k in keys) and len(set(keys)) == len(keys)
    if good:
        m = tier.match(keys); assert m.wait(10)
    else:
        refused(tier, lambda: tier.match(keys), ValueError, "not of this tier's namespace|are the same key")


@pytest.mark.parametrize('kw, msg', [
    (dict(tp_rank=False, tp_size=True), 'tp_size must be an integer, got True'),
    (dict(tp_rank=True, tp_size=2), 'tp_rank must be an integer, got True'),
    (dict(tp_rank=0, tp_size=0), 'tp_size must be an integer >= 1'),
    (dict(tp_rank=-1, tp_size=2), r'tp_rank must be an integer in \[0, 1\]'),
    (dict(tp_rank=0.0, tp_size=1), 'tp_rank must be an integer'),
    (dict(page_size=0), r"layout\['page_size'\] must be an integer >= 1, got 0"),
    (dict(page_size=-16), r"layout\['page_size'\] must be an integer >= 1"),
    (dict(page_size='16'), r"layout\['page_size'\] must be an integer"),
    (dict(layout=[1, 2]), 'layout must be a FlatHostMirror or its layout_fingerprint dict, got list'),
    (dict(layout=None), 'layout must be a FlatHostMirror'),
    (dict(layout={'tensors': []}), "layout has no 'page_size'"),
])
def test_namespace_refuses_what_would_name_other_keys(kw, msg):
    mirror = engine('per-layer', host_pages=4)[1]
    layout = layout_fingerprint(mirror)
    if 'page_size' in kw: layout = layout | {'page_size': kw.pop('page_size')}
    if 'layout' in kw: layout = kw.pop('layout')
    with pytest.raises((TypeError, ValueError), match=msg): L3Namespace('m', layout, salt=b's', **kw)


# ---- 2. lifecycle: a closed store refuses, a closing tier ends its calls by their deadlines ----

def test_closed_store_refuses_every_call(shared_mooncake):
    store = MooncakeStore(shared_mooncake.master)
    buf = torch.zeros(4, 4096, dtype=torch.uint8); store.register(buf)
    store.close(); store.close()                                   # idempotent
    assert store.closed and 'closed' in repr(store)
    for f in (lambda: store.batch_exists(['a']), lambda: store.batch_put_from(['a'], buf, [0], [4096]),
              lambda: store.batch_get_into(['a'], buf, [0], [4096]), lambda: store.register(torch.zeros(8, dtype=torch.uint8))):
        with pytest.raises(RuntimeError, match=r'on a closed store \(127\.0\.0\.1:\d+\): nothing was sent'): f()


@pytest.mark.parametrize('probe_s', [0.2, 0.001])
def test_tier_on_a_closed_store_reports_down_and_holds_nothing(shared_mooncake, probe_s):
    """The store closed under a live tier: it refuses each call before sending (`NothingSent`), so every page is
    reported DOWN and none is held or quarantined, whether a call is refused by the open circuit (probe_s 0.2) or
    admitted as its probe and refused by the store (probe_s 0.001: every call probes)."""
    pool, mirror, ns = engine('per-layer', host_pages=8, salt=os.urandom(8))
    store = MooncakeStore(shared_mooncake.master)
    with L3Tier(mirror, store, ns, timeout_s=0.5, probe_interval_s=probe_s) as t:
        keys = ns.keys(tokens(50, 4 * 3))
        store.close()
        for call in (lambda: t.match(keys), lambda: t.get(keys, [1, 2, 3]), lambda: t.put([4, 5, 6], keys)):
            time.sleep(2 * probe_s if probe_s < 0.1 else 0)
            h = call()
            assert h.wait(2) and h.codes.tolist() == [DOWN] * 3 and h.released
        assert not t.held().any() and t.quarantined() == []
        assert t.stats['trips'] == 1                               # the first DOWN opened the circuit, once


def test_store_closed_with_a_call_inside_closes_when_it_returns(mooncake):
    "close() never waits: with a call stuck in a frozen master it returns at once; the call's return closes the client."
    pool, mirror, ns = engine('per-layer', host_pages=8)
    store = MooncakeStore(mooncake.master)
    with L3Tier(mirror, store, ns, timeout_s=0.3) as t:
        keys = ns.keys(tokens(51, 4 * 2))
        try:
            freeze(mooncake.master_proc)
            h = t.match(keys); time.sleep(0.1)                      # a worker is inside the client now
            t0 = time.monotonic(); store.close(); assert time.monotonic() - t0 < 0.05
            assert h.wait(2) and set(h.codes.tolist()) == {TIMEOUT}
            with pytest.raises(RuntimeError, match='closed store'): store.batch_exists(keys)
        finally: os.kill(mooncake.master_proc.pid, signal.SIGCONT)
        assert h.wait_released(30)                                  # the stuck call returned (and closed the client)
        with pytest.raises(RuntimeError, match='closed store'): store.batch_exists(keys)


def test_tier_closed_with_a_call_in_flight_completes_it_by_its_deadline(mooncake):
    pool, mirror, ns = engine('per-layer', host_pages=8)
    with L3Tier(mirror, MooncakeStore(mooncake.master), ns) as t0_:
        assert t0_.put_tokens(tokens(52, 4 * 3), [1, 2, 3]).wait(10)
    t = L3Tier(mirror, MooncakeStore(mooncake.master), ns, timeout_s=0.4, workers=1)
    try:
        freeze(mooncake.master_proc)
        running = t.get_tokens(tokens(52, 4 * 3), [4, 5, 6]); time.sleep(0.05)
        queued = t.match(ns.keys(tokens(53, 4 * 2)))
        start = time.monotonic(); t.close(timeout_s=1.0); closing = time.monotonic() - start
        assert closing < 1.3
        assert running.wait(0.6) and set(running.codes.tolist()) == {TIMEOUT}   # by its deadline, not at the thaw
        assert queued.done and set(queued.codes.tolist()) == {DOWN}
        assert time.monotonic() - start < 1.5
        with pytest.raises(RuntimeError, match='closed'): t.match(ns.keys(tokens(53, 4)))
    finally: os.kill(mooncake.master_proc.pid, signal.SIGCONT)
    assert running.wait_released(30) and (running.codes == TIMEOUT).all()     # the late answer never turns into "loaded"


# ---- 3. every wait bounded ----

@pytest.fixture
def silent_port():
    "A port that accepts connections (the kernel's backlog) and never answers."
    s = socket.create_server(('127.0.0.1', 0))
    yield s.getsockname()[1]
    s.close()


def test_store_against_a_port_that_never_answers_fails_in_time(silent_port):
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f'127.0.0.1:{silent_port} accepted a connection but did not answer within 1 s'):
        MooncakeStore(f'127.0.0.1:{silent_port}', connect_timeout_s=1)
    assert time.monotonic() - t0 < 2
    with pytest.raises(ConnectionError, match='did not answer'):
        MooncakeStore.from_config({'master_server_address': f'127.0.0.1:{silent_port}'}, connect_timeout_s=0.5)


def test_store_against_a_frozen_master_fails_in_time(mooncake):
    try:
        freeze(mooncake.master_proc)
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match=f'{mooncake.master} accepted a connection but did not answer'):
            MooncakeStore(mooncake.master, connect_timeout_s=0.5)
        assert time.monotonic() - t0 < 1.5
    finally: os.kill(mooncake.master_proc.pid, signal.SIGCONT)
    MooncakeStore(mooncake.master).close()                         # thawed: it answers again


@pytest.mark.parametrize('timeout, exc, msg', [('1', TypeError, 'timeout must be a number of seconds'),
                                               (-1, ValueError, r'timeout must lie in \[0, inf\]'),
                                               (float('nan'), ValueError, 'timeout must lie in'),
                                               (True, TypeError, 'timeout must be a number')])
def test_handle_waits_check_their_timeout(tier, timeout, exc, msg):
    h = tier.match(tier.namespace.keys(tokens(60, 4)))
    for wait in (h.wait, h.wait_released):
        with pytest.raises(exc, match=msg): wait(timeout)
    assert h.wait(10)


def test_huge_waits_mean_no_limit(tier):
    h = tier.match(tier.namespace.keys(tokens(61, 8)))
    assert h.wait(1e12) and h.wait_released(float('inf')) and h.wait(threading.TIMEOUT_MAX * 2)


# ---- 4. every argument named, refused before anything starts ----

@pytest.mark.parametrize('kw, msg', [
    (dict(workers=-1), r'workers must be an integer in \[1, 64\], got -1'), (dict(workers=0), 'workers must be'),
    (dict(workers=True), 'workers must be an integer, got True'), (dict(workers=2.0), 'workers must be an integer'),
    (dict(timeout_s='1'), "timeout_s must be a number of seconds, got '1'"), (dict(timeout_s=0), 'timeout_s must lie in'),
    (dict(timeout_s=1e9), r'timeout_s must lie in \(0, 3600\]'), (dict(timeout_s=float('nan')), 'timeout_s must lie in'),
    (dict(probe_interval_s=-0.1), 'probe_interval_s must lie in'), (dict(probe_interval_s=None), 'probe_interval_s must be a number'),
    (dict(batch_bytes=0), 'batch_bytes must be an integer >= 1'), (dict(batch_bytes='64mb'), 'batch_bytes must be an integer'),
    (dict(max_batch_pages=0), 'max_batch_pages must be'), (dict(max_queued_pages=-5), 'max_queued_pages must be'),
    (dict(store=object()), 'store must implement L3Store'), (dict(namespace='ns'), 'namespace must be an L3Namespace'),
    (dict(mirror=torch.zeros(4)), 'mirror must be a FlatHostMirror'),
])
def test_tier_arguments_named(tier, kw, msg):
    args = dict(mirror=tier.mirror, store=tier.store, namespace=tier.namespace) | kw
    t0 = time.monotonic()
    with pytest.raises((TypeError, ValueError), match=msg):
        L3Tier(args.pop('mirror'), args.pop('store'), args.pop('namespace'), **args)
    assert time.monotonic() - t0 < 0.5


@pytest.mark.parametrize('kw, msg', [
    (dict(segment_bytes=-1), 'segment_bytes must be an integer >= 0'), (dict(segment_bytes=1 << 20), 'at least 16 MiB'),
    (dict(segment_bytes='2 gigs'), 'segment_bytes must be a byte count'), (dict(local_buffer_bytes=-1), 'local_buffer_bytes'),
    (dict(connect_timeout_s='2'), 'connect_timeout_s must be a number'), (dict(connect_timeout_s=0), 'connect_timeout_s must lie'),
    (dict(protocol=1), 'protocol must be a str'), (dict(tenant_id=None), 'tenant_id must be a str'),
])
def test_store_arguments_named(shared_mooncake, kw, msg):
    t0 = time.monotonic()
    with pytest.raises((TypeError, ValueError), match=msg): MooncakeStore(shared_mooncake.master, **kw)
    assert time.monotonic() - t0 < 0.5


def test_config_sizes_as_the_engine_writes_them(shared_mooncake, monkeypatch):
    s = MooncakeStore.from_config({'master_server_address': shared_mooncake.master, 'global_segment_size': '16mb',
                                   'local_buffer_size': '32MB'})
    assert s.segment_bytes == 16 << 20; s.close()
    with pytest.raises(ValueError, match="global_segment_size must be a byte count or a size such as '16mb'"):
        MooncakeStore.from_config({'master_server_address': shared_mooncake.master, 'global_segment_size': '2 gigs'})
    with pytest.raises(ValueError, match='local_buffer_size must be'):
        MooncakeStore.from_config({'master_server_address': shared_mooncake.master, 'local_buffer_size': '1e6'})
    monkeypatch.setenv('MOONCAKE_MASTER', shared_mooncake.master)
    monkeypatch.setenv('MOONCAKE_GLOBAL_SEGMENT_SIZE', '16 gigabytes')
    with pytest.raises(ValueError, match='MOONCAKE_GLOBAL_SEGMENT_SIZE must be'): MooncakeStore.from_config()
    with pytest.raises(TypeError, match='config must be a dict'): MooncakeStore.from_config(['x'])
    assert [size_bytes('x', v) for v in ('2gb', '16mb', '0', 5)] == [2 << 30, 16 << 20, 0, 5]


@pytest.mark.parametrize('kind, msg', [('fifo', 'is not a regular file'), ('dir', 'is not a regular file'),
                                       ('missing', 'No such file'), ('not json', 'is not JSON'),
                                       ('binary', 'is not UTF-8 text'), ('a list', 'holds a list')])
def test_config_path_that_is_not_a_json_file_is_refused_at_once(tmp_path, kind, msg):
    "A config path names a regular file holding a JSON object; anything else is refused naming the path, at once (a FIFO's read waited for a writer)."
    p = tmp_path / 'cfg'
    if kind == 'fifo': os.mkfifo(p)
    elif kind == 'dir': p.mkdir()
    elif kind == 'not json': p.write_text('{"master_server_address": ')
    elif kind == 'binary': p.write_bytes(b'\xff\xfe\x00')
    elif kind == 'a list': p.write_text('["127.0.0.1:1"]')
    t0 = time.monotonic()
    for arg in (str(p), p):                                    # a str or a Path
        with pytest.raises(ValueError, match=msg) as e: MooncakeStore.from_config(arg)
        assert str(p) in str(e.value)
    assert time.monotonic() - t0 < 1


def _masters():
    "Process ids of the mooncake_master processes this test process started that run now."
    # (only its own: another pytest-xdist worker's servers come and go meanwhile, and counting every master on the
    # machine failed a test when one started between its two counts)
    out = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f: cmd = f.read()
            with open(f'/proc/{pid}/stat') as f: ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError): continue
        if ppid == os.getpid() and b'mooncake_master' in cmd.split(b'\0')[0]: out.append(int(pid))
    return set(out)


@pytest.mark.parametrize('size', [-1, 0, 1 << 20, '15mb', 1 << 62, 'lots', 2.5, None])
def test_local_servers_refuse_bad_sizes_at_once(size):
    before, t0 = _masters(), time.monotonic()
    with pytest.raises((TypeError, ValueError), match='segment_bytes'): LocalMooncake(segment_bytes=size)
    assert time.monotonic() - t0 < 0.5 and _masters() == before


def test_a_failed_start_stops_what_it_started(tmp_path):
    "The store process cannot start (its log path is a directory) after the master did: start stops the master."
    (tmp_path / 'store.log').mkdir()
    before = _masters()
    srv = LocalMooncake(segment_bytes=16 << 20, start=False, log_dir=str(tmp_path))
    with pytest.raises(IsADirectoryError): srv.start()
    assert srv.pids == [] and _masters() == before


# ---- 6. setup: every value bounded and named by its source; every server it talks to answers by the deadline ----

NOWHERE = '127.0.0.1:1'       # a master never reached: each refusal below comes before anything is sent
ARGS = {'master': ('master_server_address', 'MOONCAKE_MASTER'), 'protocol': ('protocol', 'MOONCAKE_PROTOCOL'),
        'metadata_server': ('metadata_server', 'MOONCAKE_TE_META_DATA_SERVER'),
        'local_hostname': ('local_hostname', 'MOONCAKE_LOCAL_HOSTNAME'),
        'segment_bytes': ('global_segment_size', 'MOONCAKE_GLOBAL_SEGMENT_SIZE'),
        'local_buffer_bytes': ('local_buffer_size', 'MOONCAKE_LOCAL_BUFFER_SIZE'),
        'device': ('device_name', 'MOONCAKE_DEVICE'), 'tenant_id': ('tenant_id', 'MOONCAKE_TENANT_ID')}
RAM = "must be at most this machine's physical memory"
BAD_VALUES = [   # (argument, bad value, what the refusal says right after the name of the value's source)
    ('segment_bytes', '4096tb', RAM), ('segment_bytes', 2**64, RAM), ('segment_bytes', '9' * 30, RAM),
    ('segment_bytes', '1mb', r'must be 0 \(mount nothing\) or at least 16 MiB'), ('segment_bytes', '9' * 31, 'must be a byte count'),
    ('segment_bytes', '1e12', 'must be a byte count'), ('segment_bytes', '16\udcffmb', 'must be a byte count'),
    ('segment_bytes', -1, 'must be an integer >= 0'), ('segment_bytes', 1.5e9, 'must be an integer'),
    ('segment_bytes', True, 'must be an integer'),
    ('local_buffer_bytes', '4096tb', RAM), ('local_buffer_bytes', 2**64, RAM), ('local_buffer_bytes', '2 gigs', 'must be a byte count'),
    ('local_buffer_bytes', None, 'must be an integer'),
    ('protocol', 'udp', "must be one of 'tcp', 'rdma', got 'udp'"), ('protocol', 'TCP', 'must be one of'),
    ('protocol', 'cxl', 'must be one of'), ('protocol', '', 'must be one of'), ('protocol', 'tcp\udcff', 'must be one of'),
    ('protocol', 'tcp\x00', r"holds the control character '\\x00'"), ('protocol', 5, 'must be a str'),
    ('master', 'localhost', "must be 'host:port'"), ('master', '127.0.0.1:0', "must be 'host:port'"),
    ('master', '127.0.0.1:65536', "must be 'host:port'"), ('master', 'bad host:50051', "must be 'host:port'"),
    ('master', '999.1.1.1:50051', "must be 'host:port'"), ('master', '[::1:50051', "must be 'host:port'"),
    ('master', 'h\udcff:50051', "must be 'host:port'"), ('master', '127.0.0.1:50051\n', 'holds the control character'),
    ('master', 50051, 'must be a str'),
    ('local_hostname', 'my host', "must be 'host' or 'host:port'"), ('local_hostname', 'h:99999', "must be 'host' or 'host:port'"),
    ('local_hostname', '', "must be 'host' or 'host:port'"), ('local_hostname', 'h\x7f', 'holds the control character'),
    ('metadata_server', 'redis://127.0.0.1:6379', 'must be .* has no plugin for'), ('metadata_server', 'foo://x', "must be .* has no plugin for 'foo'"),
    ('metadata_server', 'p2phandshake', "must be 'P2PHANDSHAKE'"), ('metadata_server', 'http://h:99999/m', "must be 'P2PHANDSHAKE'"),
    ('metadata_server', 'etcd://h:1,,h:2', "must be 'P2PHANDSHAKE'"), ('metadata_server', '', "must be 'P2PHANDSHAKE'"),
    ('metadata_server', 'http://h/m?x=1', "must be 'P2PHANDSHAKE'"),
    ('device', 'mlx5_0 mlx5_1', "must be '' or device names"), ('device', 'a,,b', "must be '' or device names"),
    ('device', 'x' * 65, "must be '' or device names"), ('device', 0, 'must be a str'),
    ('tenant_id', '', 'must be 1 to 256 printable ASCII'), ('tenant_id', 'a tenant', 'must be 1 to 256 printable ASCII'),
    ('tenant_id', 'x' * 257, 'must be 1 to 256'), ('tenant_id', 'café', 'must be 1 to 256'), ('tenant_id', None, 'must be a str'),
]


def _no_mooncake_env(monkeypatch):
    for var in [v for v in os.environ if v.startswith('MOONCAKE_')]: monkeypatch.delenv(var)


def _via(arg, value, via, monkeypatch):
    "(the name the refusal must give, the call) for `arg` = `value` given as a keyword, a config key, a from_config keyword or a variable."
    key, var = ARGS[arg]
    base = {} if arg == 'master' else {'master_server_address': NOWHERE}
    if via == 'keyword':
        return arg, (lambda: MooncakeStore(value)) if arg == 'master' else (lambda: MooncakeStore(NOWHERE, **{arg: value}))
    if via == 'config key': return key, lambda: MooncakeStore.from_config(base | {key: value})
    if via == 'from_config keyword': return arg, lambda: MooncakeStore.from_config({'master_server_address': NOWHERE}, **{arg: value})
    _no_mooncake_env(monkeypatch)
    monkeypatch.setenv('MOONCAKE_MASTER', NOWHERE); monkeypatch.setenv(var, value)
    return var, lambda: MooncakeStore.from_config()


@pytest.mark.parametrize('arg, value, msg, via', [
    pytest.param(arg, value, msg, via, id=f'{arg}={value!r:.24}-{via}') for arg, value, msg in BAD_VALUES
    for via in ('keyword', 'config key', 'from_config keyword', 'variable')
    if via != 'variable' or (isinstance(value, str) and '\0' not in value)])      # a variable holds a str without NUL
def test_every_setup_value_refused_naming_its_source(arg, value, msg, via, monkeypatch):
    "Each bad value of each kind, from each source, is refused before anything is sent, by the name it came in with."
    name, call = _via(arg, value, via, monkeypatch)
    t0 = time.monotonic()
    with pytest.raises((TypeError, ValueError), match=rf'^{re.escape(name)} {msg}'): call()
    assert time.monotonic() - t0 < 0.5


@pytest.mark.parametrize('via', ['keyword', 'config key', 'from_config keyword', 'variable'])
def test_rdma_devices_must_be_this_machines(via, monkeypatch):
    "With rdma a device name must be an RDMA device here (Mooncake retried a missing one for 22 s); with tcp Mooncake ignores it."
    name, call = _via('device', 'tsl_no_such_nic0', via, monkeypatch)
    rdma = {'keyword': lambda: MooncakeStore(NOWHERE, protocol='rdma', device='tsl_no_such_nic0'),
            'config key': lambda: MooncakeStore.from_config({'master_server_address': NOWHERE, 'protocol': 'rdma',
                                                             'device_name': 'tsl_no_such_nic0'}),
            'from_config keyword': lambda: MooncakeStore.from_config({'master_server_address': NOWHERE, 'protocol': 'rdma'},
                                                                     device='tsl_no_such_nic0')}
    if via == 'variable': monkeypatch.setenv('MOONCAKE_PROTOCOL', 'rdma')
    with pytest.raises(ValueError, match=rf"^{name} names 'tsl_no_such_nic0', not an RDMA device of this machine"):
        rdma.get(via, call)()
    if via == 'variable': monkeypatch.setenv('MOONCAKE_PROTOCOL', 'tcp')
    with pytest.raises(ConnectionError, match='cannot reach the Mooncake master at 127.0.0.1:1'):
        (call if via != 'keyword' else lambda: MooncakeStore(NOWHERE, device='tsl_no_such_nic0', connect_timeout_s=0.5))()


def test_sizes_together_bounded_by_the_memory(monkeypatch):
    half = ram_bytes() // 2
    with pytest.raises(ValueError, match="^segment_bytes and local_buffer_bytes together must be at most this machine's physical"):
        MooncakeStore(NOWHERE, segment_bytes=half + (64 << 20), local_buffer_bytes=half)
    with pytest.raises(ValueError, match='^global_segment_size and local_buffer_bytes together'):    # a key and a keyword
        MooncakeStore.from_config({'master_server_address': NOWHERE, 'global_segment_size': half + (64 << 20)}, local_buffer_bytes=half)
    _no_mooncake_env(monkeypatch)
    for var, v in (('MOONCAKE_MASTER', NOWHERE), ('MOONCAKE_GLOBAL_SEGMENT_SIZE', f'{half + (64 << 20)}'), ('MOONCAKE_LOCAL_BUFFER_SIZE', f'{half}b')):
        monkeypatch.setenv(var, v)
    with pytest.raises(ValueError, match='^MOONCAKE_GLOBAL_SEGMENT_SIZE and MOONCAKE_LOCAL_BUFFER_SIZE together'): MooncakeStore.from_config()


@pytest.mark.parametrize('kw, msg', [(dict(connect_timeout_s=0), 'connect_timeout_s must lie in'),
                                     (dict(connect_timeout_s=1e9), r'connect_timeout_s must lie in \(0, 3600\]'),
                                     (dict(connect_timeout_s='2'), 'connect_timeout_s must be a number of seconds'),
                                     (dict(segment_size=1), 'from_config takes master, protocol')])
def test_from_config_keywords_checked(kw, msg):
    with pytest.raises((TypeError, ValueError), match=msg): MooncakeStore.from_config({'master_server_address': NOWHERE}, **kw)


@pytest.fixture
def answering_port():
    "A port whose server answers every connection with `answer[0]` (bytes the test sets), then hangs up."
    answer, s = [b''], socket.create_server(('127.0.0.1', 0))
    def serve():
        while True:
            try: c, _ = s.accept()
            except OSError: return
            with c:
                try: c.recv(4096); c.sendall(answer[0])
                except OSError: pass
    threading.Thread(target=serve, daemon=True).start()
    yield s.getsockname()[1], answer
    s.close()


@pytest.mark.parametrize('form', ['http', 'https', 'etcd', 'etcd://', 'two etcd endpoints'])
def test_metadata_server_that_never_answers_fails_by_the_deadline(shared_mooncake, silent_port, form):
    "A real master and a metadata server that accepts and never answers (Mooncake's setup waited 6 s a try, 20 tries): a ConnectionError naming it, by connect_timeout_s."
    at = f'127.0.0.1:{silent_port}'
    meta = {'http': f'http://{at}/metadata', 'https': f'https://{at}/metadata', 'etcd': at, 'etcd://': f'etcd://{at}',
            'two etcd endpoints': f'etcd://{at};{at}'}[form]
    shown = meta if form.startswith('http') else at
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=re.escape(f'metadata server at {shown} accepted a connection but did not answer within 0.5 s')):
        MooncakeStore(shared_mooncake.master, metadata_server=meta, connect_timeout_s=0.5)
    assert time.monotonic() - t0 < 1.0


def test_config_metadata_server_that_never_answers_names_its_address(shared_mooncake, silent_port, monkeypatch):
    meta = f'http://127.0.0.1:{silent_port}/metadata'
    msg = re.escape(f'the metadata server at {meta} accepted a connection but did not answer within 1 s')
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=msg):
        MooncakeStore.from_config({'master_server_address': shared_mooncake.master, 'metadata_server': meta}, connect_timeout_s=1)
    assert time.monotonic() - t0 < 1.5
    _no_mooncake_env(monkeypatch)
    monkeypatch.setenv('MOONCAKE_MASTER', shared_mooncake.master); monkeypatch.setenv('MOONCAKE_TE_META_DATA_SERVER', meta)
    with pytest.raises(ConnectionError, match=msg): MooncakeStore.from_config(connect_timeout_s=1)


@pytest.mark.parametrize('form, answer, msg', [
    ('http', b'SSH-2.0-OpenSSH_9.6\r\n', r"answered b'SSH-2.0-OpenSSH_9.6', not HTTP"),
    ('http', b'', 'metadata server at http://127.0.0.1:[0-9]+/metadata hung up without answering'),
    ('etcd', b'HTTP/1.1 503 Service Unavailable\r\n\r\n', r'not 200 to GET /health \(an unhealthy etcd\)'),
    ('https', b'HTTP/1.1 200 OK\r\n\r\n', 'did not complete a TLS handshake'),
    ('closed', b'', 'cannot reach the metadata server at http://127.0.0.1:1/m'),
])
def test_metadata_server_that_is_not_one_refused_at_once(shared_mooncake, answering_port, form, answer, msg):
    port, answers = answering_port
    answers[0] = answer
    meta = {'http': f'http://127.0.0.1:{port}/metadata', 'https': f'https://127.0.0.1:{port}/metadata',
            'etcd': f'127.0.0.1:{port}', 'closed': 'http://127.0.0.1:1/m'}[form]
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=msg): MooncakeStore(shared_mooncake.master, metadata_server=meta, connect_timeout_s=1)
    assert time.monotonic() - t0 < 0.5


def test_a_real_http_metadata_server_passes_the_probe(tmp_path):
    "Mooncake's own HTTP metadata server (the master's) answers the probe, and a client set up through it stores and reads back."
    from tokenspeed_lit.l3.servers import mooncake_master_path, free_port
    rpc, http = free_port(), free_port()
    cmd = [mooncake_master_path(), f'--rpc_port={rpc}', '--rpc_address=127.0.0.1', f'--metrics_port={free_port()}',
           '--metrics_host=127.0.0.1', '--enable_http_metadata_server=true', f'--http_metadata_server_port={http}',
           '--http_metadata_server_host=127.0.0.1']
    with open(tmp_path / 'master.log', 'wb') as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        master, meta, end = f'127.0.0.1:{rpc}', f'http://127.0.0.1:{http}/metadata', time.monotonic() + 15
        while True:
            try: check_master(master, 0.2); check_metadata_server(meta, 0.2); break
            except ConnectionError:
                assert time.monotonic() < end and p.poll() is None, (tmp_path / 'master.log').read_text()[-2000:]
                time.sleep(0.05)
        store = MooncakeStore(master, metadata_server=meta, segment_bytes=16 << 20)
        buf = (torch.arange(2 * 4096) % 251).to(torch.uint8); store.register(buf)
        assert store.batch_put_from(['meta/0'], buf, [0], [4096]) == [0]
        assert store.batch_get_into(['meta/0'], buf, [4096], [4096]) == [4096] and torch.equal(buf[4096:], buf[:4096])
        store.close()
    finally: p.kill(); p.wait(5)


@pytest.mark.parametrize('kind, msg', [
    ('a file as a folder', 'Not a directory'), ('a directory', 'is not a regular file'),
    ('NUL in a str path', 'holds a NUL byte'), ('NUL in a bytes path', 'holds a NUL byte'),
    ('a name too long', 'File name too long'), ('non-UTF-8 name, missing', 'No such file'),
    ('non-UTF-8 text', r'is not UTF-8 text \(byte 0xff at offset 27\)'), ('over 1 MiB', 'holds more than a config can'),
    ('nested too deep', 'is not JSON'), ('a key twice', "writes the key 'protocol' twice")])
def test_config_file_refused_naming_its_path(tmp_path, kind, msg):
    "Every config path that is not a readable JSON file of one object is refused at once, naming the path as given."
    (tmp_path / 'cfg.json').write_text('{}')
    path = {'a file as a folder': str(tmp_path / 'cfg.json' / 'x.json'), 'a directory': str(tmp_path),
            'NUL in a str path': str(tmp_path / 'a\0b.json'), 'NUL in a bytes path': os.fsencode(tmp_path) + b'/a\0b.json',
            'a name too long': str(tmp_path / ('x' * 300)), 'non-UTF-8 name, missing': os.fsencode(tmp_path) + b'/\xff.json'
            }.get(kind, str(tmp_path / 'c.json'))
    content = {'non-UTF-8 text': b'{"master_server_address": "\xff"}', 'over 1 MiB': b' ' * (1 << 20) + b'{}',
               'nested too deep': b'[' * 100_000 + b']' * 100_000,
               'a key twice': b'{"protocol": "tcp", "protocol": "rdma"}'}.get(kind)
    if content is not None: open(path, 'wb').write(content)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=msg) as e: MooncakeStore.from_config(path)
    assert repr(path) in str(e.value) and time.monotonic() - t0 < 1


def test_config_file_with_a_non_utf8_name_is_read(tmp_path):
    "A path is bytes to Linux: a name that is not UTF-8 is read like any other (its bad protocol named by its key)."
    path = os.fsencode(tmp_path) + b'/\xff.json'
    open(path, 'wb').write(b'{"master_server_address": "127.0.0.1:1", "protocol": "udp"}')
    for p in (path, os.fsdecode(path)):
        with pytest.raises(ValueError, match="^protocol must be one of 'tcp', 'rdma', got 'udp'"): MooncakeStore.from_config(p)
