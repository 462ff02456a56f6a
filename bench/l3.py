"""Benchmark of the L3 tier (issue 26, Goals): `L3Tier` against the bare Mooncake client on the same pages, in one run.

    python bench/l3.py                      # GPU machine: page sizes 16 and 64, 32 layers K+V 8x128 bf16, 1024 pages
    python bench/l3.py --tiny               # any machine: a smoke test with tiny sizes (what tests/test_bench_l3.py runs)

It starts its own `mooncake_master` and store process (`LocalMooncake`, 127.0.0.1, free ports) for each page size,
writes `bench/results/l3.json` and prints it. The JSON (see `run`):

    {"gpu", "torch", "mooncake", "config", "rows": [...], "pipelined": [...]}
    rows:      {"op": "put"|"get", "page_size", "pages", "tier_GBps", "raw_GBps", "caller_us", "match_us_per_key", ...}
    pipelined: {"page_size", "pages", "l3_get_ms", "h2d_ms", "total_ms", ..., "sweep": [tier put/get GB/s for
               other workers/batch_bytes settings]}

Goals: tier_GBps >= 0.9 * raw_GBps; caller_us (the caller's host time for one call of 256 pages, hashing excluded)
<= 100; total_ms <= 1.1 * max(l3_get_ms, h2d_ms). The caller's time is taken four ways. Three follow a blocking
wait for the previous call: `caller_us` after 2 ms idle, `caller_us_hot` right after the last call was released,
`caller_us_in_loop` after a scheduler's Python pass. `caller_us_serving` is the way an engine calls it: in a serving
loop whose every step runs a scheduler's pass and a forward stand-in on the device (matrix products, then a
synchronize), the call made after the step's scheduler pass once the last call's pages are released, which the loop
polls once per step and never waits for (`serving_calls`). `caller_us_first` is the tier's first put and first get
after its construction (of all `pages`, in the throughput's warm-up round; only a warm-up match of 8 keys came before).

Mooncake on a machine without a package index: install the carried wheel with pip, unpack its .deb libraries
(libibverbs1 libnuma1 librdmacm1 libnl-3-200 libnl-route-3-200) with `dpkg -x` into a folder and put that folder's
usr/lib/x86_64-linux-gnu on LD_LIBRARY_PATH before running this (the store process inherits the environment).
"""
from __future__ import annotations
import argparse, json, os, statistics, sys, time, traceback
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tokenspeed_lit.core.device import default_device, is_accel  # noqa: E402
from tokenspeed_lit.core.streams import new_stream, synchronize
from tokenspeed_lit.tiers.kv_pool import PagedKVPool  # noqa: E402
from tokenspeed_lit.tiers.host_mirror import FlatHostMirror  # noqa: E402
from tokenspeed_lit.l3.keys import L3Namespace  # noqa: E402
from tokenspeed_lit.l3.tier import L3Handle, L3Tier  # noqa: E402
from tokenspeed_lit.l3.servers import LocalMooncake  # noqa: E402
from tokenspeed_lit.l3.store import MooncakeStore, OK, code_name  # noqa: E402
from bench.serving_loop import _Req, _scheduler_pass  # noqa: E402  (the serving-loop benchmark's scheduler)

FULL = dict(page_sizes=(16, 64), pages=1024, layers=32, heads=8, head_dim=128, caller_pages=256, chunk_pages=32)
TINY = dict(page_sizes=(2, 4), pages=24, layers=2, heads=2, head_dim=8, caller_pages=8, chunk_pages=4)



def _gbps(nbytes: int, seconds: float) -> float:
    "Throughput in GB/s to 4 significant figures: a tiny run's few KB read as what they measured, never rounded to 0."
    return float(f'{nbytes / seconds / 1e9:.4g}')

def mooncake_version() -> str:
    for dist in ('mooncake-transfer-engine-non-cuda', 'mooncake-transfer-engine'):
        try: return f'{dist}=={metadata.version(dist)}'
        except metadata.PackageNotFoundError: pass
    return 'unknown'


def bare_client(master: str):
    "Mooncake's own client, set up the way MooncakeStore does it (the 'raw' side of every comparison)."
    from mooncake.store import MooncakeDistributedStore
    c = MooncakeDistributedStore()
    ret = c.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', '', master)
    if ret != 0: raise RuntimeError(f'bare client setup failed: {ret}')
    return c


_REQS = [_Req(i) for i in range(4000)]

def scheduler_pass(k: int):
    "What an engine's scheduler runs before it calls the tier: Python over its 4000 requests (bench.serving_loop's)."
    _scheduler_pass(_REQS, k)


def settle():
    "Let the tier's threads go idle (2 ms), then spin 0.5 ms so that the caller's core is awake."
    time.sleep(0.002)
    end = time.perf_counter() + 0.0005
    while time.perf_counter() < end: pass


def serving_calls(calls, device, products: int = 4, k0: int = 0) -> list[int]:
    """The caller's ns of each of `calls` (zero-argument callables returning an `L3Handle`; anything else counts as
    done at once), made as an engine makes them: every step runs a scheduler's pass and then a forward stand-in
    (`products` matrix products queued on `device`, then a synchronize); a step whose last call is done and released
    makes the next call after its scheduler pass. The loop polls the handles once per step and never blocks on them.
    Raises if a call failed."""
    n = 2048 if is_accel(device) else 128
    x = torch.randn(n, n, device=device) / n ** 0.5; y = torch.empty_like(x)
    out, h, i, k = [], None, 0, k0
    while True:
        scheduler_pass(k); k += 1
        if not isinstance(h, L3Handle) or (h.done and h.released):     # (a call may return something else: done)
            if isinstance(h, L3Handle): check_all(h.codes, f'serving loop: call {i - 1}')
            if i == len(calls): return out
            t0 = time.perf_counter_ns(); h = calls[i](); out.append(time.perf_counter_ns() - t0); i += 1
        for _ in range(products): torch.mm(x, x, out=y)
        synchronize(device)


def timed(f):
    "Seconds f() takes, and its result."
    t0 = time.perf_counter(); r = f(); return time.perf_counter() - t0, r


def check_all(codes, what):
    "Raise if any page of a benchmark call failed (a number for a failed call would be meaningless)."
    codes = np.asarray(codes)
    if (codes != OK).any():
        bad = sorted({code_name(c) for c in codes[codes != OK]})
        raise RuntimeError(f'{what}: {int((codes != OK).sum())} of {len(codes)} pages failed ({", ".join(bad)})')


def one_page_size(page_size, pages, layers, heads, head_dim, caller_pages, chunk_pages, device, repeats, timeout_s,
                  tput_repeats, sweep_knobs=False):
    "Rows and the pipelined row for one page size, against a fresh master and store process."
    # The device pool (pages + the dummy page 0) and a mirror with room for two copies: src = host pages [0, pages),
    # dst = [pages, 2 pages). Device page p + 1 is stored in host page p.
    pool = PagedKVPool(num_pages=pages + 1, page_size=page_size, num_layers=layers, num_kv_heads=heads,
                       head_dim=head_dim, dtype=torch.bfloat16, device=device)
    for t in [*pool.k_buffer, *pool.v_buffer]:
        t.view(torch.int16).random_(-2**15, 2**15 - 1)
    mirror = FlatHostMirror(pool, num_host_pages=2 * pages)
    pb = mirror.bytes_per_host_page()
    src, dst = np.arange(pages), np.arange(pages, 2 * pages)
    mirror.store_pages([(p + 1, p) for p in range(pages)]); synchronize(device)
    total = pages * pb
    gen = torch.Generator().manual_seed(page_size)
    toks = lambda: torch.randint(0, 100_000, (pages * page_size,), generator=gen).tolist()
    # Keys (hashing is not part of any timing). Raw and tier use separate namespaces: a put must find its keys absent.
    warm_ns = L3Namespace('bench@1', mirror, salt=b'bench warm-up')
    keys_warm = warm_ns.keys(toks())[:8]
    segment = int(2.3 * total) + (256 << 20)
    print(f'page_size {page_size}: {pages} pages of {pb / 2**20:.2f} MiB, store segment {segment / 2**30:.1f} GiB',
          flush=True)
    with LocalMooncake(segment_bytes=segment) as srv:
        buf = mirror.host_pages
        raw = bare_client(srv.master)
        ret = raw.register_buffer(buf.data_ptr(), buf.numel())
        if ret != 0: raise RuntimeError(f'register_buffer failed: {ret}')
        base = buf.data_ptr()
        ptr = lambda pages_: [base + int(p) * pb for p in pages_]
        sizes = [pb] * pages
        ns_raw = L3Namespace('bench@1', mirror, salt=b'bench raw')
        ns_tier = L3Namespace('bench@1', mirror, salt=b'bench tier')
        tier = L3Tier(mirror, MooncakeStore(srv.master), ns_tier, timeout_s=timeout_s)
        try:
            # warm-up: connections and first transfers on both clients
            check_all(raw.batch_put_from(keys_warm, ptr(src[:8]), sizes[:8]), 'raw warm-up put')
            check_all([OK if r == pb else r for r in raw.batch_get_into(keys_warm, ptr(dst[:8]), sizes[:8])], 'raw warm-up get')
            _wait(tier.match(ns_tier.keys(toks())[:8]))
            # Throughput, `tput_repeats` rounds, the order of raw and tier alternating: a put of every page (the bare
            # client in one call; the tier in one call, waited for), then a get of every page into the dst host pages,
            # checked byte for byte. Each round uses fresh keys (a put must find them absent) and empties the store
            # first (remove_all, force: the objects' leases would block a plain remove). Hashing is never timed.
            t = {k: [] for k in ('raw_put', 'tier_put', 'raw_get', 'tier_get')}
            first = {}                                    # the tier's first put and get: the call's return, in ns
            for rnd in range(tput_repeats + 1):           # round 0 warms both sides' paths up: not in the medians
                if rnd: raw.remove_all(True)
                keys_raw, keys_tier = ns_raw.keys(toks()), ns_tier.keys(toks())     # fresh tokens: fresh keys
                def raw_put():
                    dt, r = timed(lambda: raw.batch_put_from(keys_raw, ptr(src), sizes)); check_all(r, 'raw put')
                    t['raw_put'].append(dt)
                def tier_put():
                    t0 = time.perf_counter_ns(); h = tier.put(src, keys_tier); first.setdefault('put', time.perf_counter_ns() - t0)
                    h.wait(); dt = (time.perf_counter_ns() - t0) / 1e9; check_all(h.codes, 'tier put')
                    h.wait_released(); t['tier_put'].append(dt)
                def raw_get():
                    buf[pages:].zero_()
                    dt, r = timed(lambda: raw.batch_get_into(keys_raw, ptr(dst), sizes))
                    check_all([OK if x == pb else x for x in r], 'raw get')
                    if not torch.equal(buf[pages:], buf[:pages]): raise RuntimeError('raw get: bytes differ')
                    t['raw_get'].append(dt)
                def tier_get():
                    buf[pages:].zero_()
                    t0 = time.perf_counter_ns(); g = tier.get(keys_tier, dst); first.setdefault('get', time.perf_counter_ns() - t0)
                    g.wait(); dt = (time.perf_counter_ns() - t0) / 1e9; check_all(g.codes, 'tier get')
                    g.wait_released()
                    if not torch.equal(buf[pages:], buf[:pages]): raise RuntimeError('tier get: bytes differ')
                    t['tier_get'].append(dt)
                for f in ((raw_put, tier_put, tier_get, raw_get) if rnd % 2 == 0 else (tier_put, raw_put, raw_get, tier_get)): f()
                print(f'  round {rnd}: ' + ', '.join(f'{k} {total / v[-1] / 1e9:.2f} GB/s' for k, v in t.items()), flush=True)

            # caller time: the tier call's return, for `caller_pages` pages (keys present: the worker only asks exists)
            cp = min(caller_pages, pages)
            caller = {'put': [], 'get': []}
            # An engine calls between steps, not back to back: let the tier's threads go idle before each timed call
            # (else the caller's time includes waiting for the GIL that a worker finishing the last call holds), then
            # spin a little so that the caller's core is awake and warm, as it is in a serving loop (`settle`).
            # Also back to back ('hot': the next call right after the last one was released), the other extreme.
            # Both come straight out of a blocking wait for the last call (100 ms with Mooncake), and the first call
            # after a long wait pays for it whatever the store: on the CI's CPU a store that only sleeps as long as
            # Mooncake's get, moving nothing, made the caller's next call as slow as Mooncake did. So 'in_loop':
            # before each call the caller's thread runs a scheduler's Python over 4000 requests, as an engine's does.
            caller_hot, caller_loop = {'put': [], 'get': []}, {'put': [], 'get': []}
            for mode, out_ in (('settled', caller), ('hot', caller_hot), ('in_loop', caller_loop)):
                for k in range(repeats):
                    for op in ('put', 'get'):
                        if mode == 'settled': settle()
                        elif mode == 'in_loop': scheduler_pass(k)
                        t0 = time.perf_counter_ns()
                        h = tier.put(src[:cp], keys_tier[:cp]) if op == 'put' else tier.get(keys_tier[:cp], dst[:cp])
                        out_[op].append(time.perf_counter_ns() - t0)
                        h.wait(); h.wait_released()
            # 'serving': as an engine calls it, in a serving loop that never blocks on the tier (`serving_calls`).
            # Half the repeats: a call of 256 pages of page size 64 takes the store ~0.7 s.
            n_srv = max(3, repeats // 2)
            calls = [(lambda: tier.put(src[:cp], keys_tier[:cp])) if j % 2 == 0 else
                     (lambda: tier.get(keys_tier[:cp], dst[:cp])) for j in range(2 * n_srv)]
            ns_ = serving_calls(calls, device)
            caller_srv = {'put': ns_[0::2], 'get': ns_[1::2]}
            match_us = []
            for _ in range(max(3, repeats // 4)):
                dt, m = timed(lambda: _wait(tier.match(keys_tier)))
                if m.prefix != pages: raise RuntimeError(f'match found {m.prefix} of {pages}')
                match_us.append(dt * 1e6 / pages)

            # pipelined: L3 -> host (tier, in chunks) -> device pool (the mirror, on a side stream), overlapped
            pipe = pipelined(tier, mirror, keys_tier, dst, pages, chunk_pages, device, timeout_s)

            # A sweep of the tier's two throughput knobs (one round each, fresh keys, the store emptied first), so
            # that one run on the GPU machine also says which defaults to keep. A failure here loses nothing else.
            sweep = []
            for workers, batch_mib in ((1, 64), (4, 64), (2, 256), (4, 256)) if sweep_knobs else ():
                try:
                    raw.remove_all(True)
                    with L3Tier(mirror, MooncakeStore(srv.master), ns_tier, timeout_s=timeout_s, workers=workers,
                                batch_bytes=batch_mib << 20) as tv:
                        keys = ns_tier.keys(toks())
                        dp, h = timed(lambda: _wait(tv.put(src, keys))); check_all(h.codes, 'sweep put'); h.wait_released()
                        dg, g = timed(lambda: _wait(tv.get(keys, dst))); check_all(g.codes, 'sweep get'); g.wait_released()
                    sweep.append(dict(workers=workers, batch_MiB=batch_mib, put_GBps=_gbps(total, dp),
                                      get_GBps=_gbps(total, dg)))
                except Exception as e:
                    sweep.append(dict(workers=workers, batch_MiB=batch_mib, error=f'{type(e).__name__}: {e}'))
        finally:
            tier.close()
            raw.close()
    med = {k: statistics.median(v[1:]) for k, v in t.items()}
    mk = lambda op: dict(
        op=op, page_size=page_size, pages=pages, page_bytes=pb, tier_GBps=_gbps(total, med[f'tier_{op}']),
        raw_GBps=_gbps(total, med[f'raw_{op}']), ratio=round(med[f'raw_{op}'] / med[f'tier_{op}'], 3),
        tier_GBps_all=[_gbps(total, x) for x in t[f'tier_{op}']],
        raw_GBps_all=[_gbps(total, x) for x in t[f'raw_{op}']],
        caller_us=round(statistics.median(caller[op]) / 1e3, 1), caller_us_min=round(min(caller[op]) / 1e3, 1),
        caller_us_hot=round(statistics.median(caller_hot[op]) / 1e3, 1),
        caller_us_in_loop=round(statistics.median(caller_loop[op]) / 1e3, 1),
        caller_us_serving=round(statistics.median(caller_srv[op]) / 1e3, 1),
        caller_us_serving_max=round(max(caller_srv[op]) / 1e3, 1), caller_us_first=round(first[op] / 1e3, 1), caller_first_pages=pages,
        caller_pages=cp, match_us_per_key=float(f'{statistics.median(match_us):.4g}'))
    pipe['sweep'] = sweep
    return [mk('put'), mk('get')], pipe


def _wait(h):
    h.wait(); return h


def pipelined(tier, mirror, keys, dst, pages, chunk_pages, device, timeout_s):
    "One pipelined row: each chunk's host -> device copy starts as soon as its L3 get has landed."
    pairs = [(int(p - pages) + 1, int(p)) for p in dst]              # host page pages+i -> device page i+1
    stream = new_stream(device)
    def h2d(prs):
        mirror.load_pages(prs, stream=stream)
    def sync(): synchronize(device)
    # the two stages alone
    mirror.host_pages[pages:].zero_()
    t_l3, g = timed(lambda: _wait(tier.get(keys, dst))); check_all(g.codes, 'pipelined: l3 get alone')
    g.wait_released()
    sync(); t_h2d, _ = timed(lambda: (h2d(pairs), sync())); sync()
    # overlapped: every chunk's get queued at once; each chunk's H2D issued when that chunk's handle is done
    for dt, _ in mirror.tensor_pairs: dt.view(torch.uint8)[dt.view(torch.uint8).shape[0] // (pages + 1):].zero_()
    mirror.host_pages[pages:].zero_(); sync()
    t0 = time.perf_counter()
    chunks = [(lo, min(lo + chunk_pages, pages)) for lo in range(0, pages, chunk_pages)]
    handles = [tier.get(keys[lo:hi], dst[lo:hi]) for lo, hi in chunks]
    for (lo, hi), h in zip(chunks, handles):
        h.wait(); check_all(h.codes, 'pipelined get')
        h2d(pairs[lo:hi])
    sync()
    t_total = time.perf_counter() - t0
    for h in handles: h.wait_released()
    # the device pool now holds the stored pages again: check a sample of pages, every tensor, byte for byte
    for i in np.linspace(0, pages - 1, min(8, pages)).astype(int):
        for dt, host in mirror.tensor_pairs:
            span = dt.shape[0] // (pages + 1)
            got = dt[(i + 1) * span:(i + 2) * span].contiguous().view(torch.uint8).cpu()
            want = host[i].contiguous().view(torch.uint8)
            if not torch.equal(got.reshape(-1), want.reshape(-1)): raise RuntimeError(f'pipelined: device page {i + 1} differs')
    return dict(page_size=mirror.page_size, pages=pages, chunk_pages=chunk_pages, l3_get_ms=round(t_l3 * 1e3, 2),
                h2d_ms=round(t_h2d * 1e3, 2), total_ms=round(t_total * 1e3, 2),
                overlap=round(t_total / max(t_l3, t_h2d), 3))


def run(page_sizes=FULL['page_sizes'], pages=FULL['pages'], layers=FULL['layers'], heads=FULL['heads'],
        head_dim=FULL['head_dim'], caller_pages=FULL['caller_pages'], chunk_pages=FULL['chunk_pages'], device=None,
        repeats=21, timeout_s=5.0, tput_repeats=5, sweep_knobs=False) -> dict:
    "The `bench/results/l3.json` dict. A page size that fails leaves an `errors` entry; the others still report."
    device = torch.device(device) if device is not None else default_device()
    out = dict(gpu=torch.cuda.get_device_name(device) if is_accel(device) else 'cpu', torch=torch.__version__,
               mooncake=mooncake_version(),
               config=dict(layers=layers, kv_heads=heads, head_dim=head_dim, dtype='bfloat16', device=str(device),
                           protocol='tcp', timeout_s=timeout_s, repeats=repeats, tput_repeats=tput_repeats, warmup_rounds=1, caller_pages=caller_pages,
                           host_pinned=bool(is_accel(device))),
               rows=[], pipelined=[], errors=[])
    for ps in page_sizes:
        try:
            rows, pipe = one_page_size(ps, pages, layers, heads, head_dim, caller_pages, chunk_pages, device,
                                       repeats, timeout_s, tput_repeats, sweep_knobs)
            out['rows'] += rows; out['pipelined'].append(pipe)
        except Exception as e:                       # one shot on the GPU machine: keep what the others measured
            traceback.print_exc()
            out['errors'].append(dict(page_size=ps, error=f'{type(e).__name__}: {e}'))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--tiny', action='store_true', help='tiny sizes (a smoke test on any machine)')
    ap.add_argument('--out', default=str(ROOT / 'bench' / 'results' / 'l3.json'))
    ap.add_argument('--pages', type=int); ap.add_argument('--page-sizes', type=int, nargs='+')
    ap.add_argument('--repeats', type=int, default=21)
    ap.add_argument('--tput-repeats', type=int, default=5, help='timed throughput rounds, after one warm-up round')
    ap.add_argument('--sweep', action='store_true', help="also sweep the tier's workers and batch_bytes (slow)")
    a = ap.parse_args(argv)
    cfg = dict(TINY if a.tiny else FULL)
    if a.pages: cfg['pages'] = a.pages
    if a.page_sizes: cfg['page_sizes'] = tuple(a.page_sizes)
    res = run(**cfg, repeats=a.repeats, tput_repeats=a.tput_repeats, sweep_knobs=a.sweep)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + '\n')
    print(json.dumps(res, indent=1))
    return 0 if not res['errors'] else 1


if __name__ == '__main__':
    rc = main()
    # Every server and client is closed by now. Leave without the interpreter's teardown: on the GPU machine the
    # Mooncake client's and CUDA's destructors at exit once held the process past its time limit after the JSON
    # was written.
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(rc)
