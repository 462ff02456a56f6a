"""Where the L3 tier's caller time goes (issue 26): the caller's part of `L3Tier.put/get` for 256 host pages of
2 MiB (page size 16, 32 layers K+V 8 x 128 bf16), piece by piece, against three stores: one that does nothing
(`null`), one that only sleeps as long as Mooncake's get takes and moves nothing (`sleep`), and a real Mooncake
client (a LocalMooncake master and store process). Each piece is timed four ways: `serving` (in a serving loop
that never blocks on the tier, as an engine calls it: `bench.l3.serving_calls`), `settled` (after a 2 ms sleep),
`hot` (right after the last call was released) and `in_loop` (after a scheduler's Python pass over 4000 requests);
the last three follow a blocking wait for the previous call. Medians in us.

    python tools/l3_caller_profile.py            # prints lines starting with PROF; smaller: --layers 4

Measured on the H200 (2026-12-01, null and mooncake only): with no store the whole call was 37-41 us hot; with
Mooncake every piece was slower (the page check 58 us against 11 us). On the CI's CPU the `sleep` store is as slow
as Mooncake: a hot call comes straight out of a blocking wait for the last one (about 100 ms with Mooncake, 0.1 ms
with the null store), and the first call after a long wait pays for it whatever the store (cold caches, an idle
core); by the third call it is gone. An idle Mooncake client spins no thread and holds no GIL (same measurement).
On the H200 in the serving mode, before the caller's path was cut (numpy checks and hold counters, one batch object
per batch made by the caller): put / get 69 / 71 us with no store, 113 / 110 us sleeping, 116 / 105 us with Mooncake;
inside them the page check 20-36 us and the handle alone 24-44 us. `bench/l3.py` measured the cut path."""
import argparse, gc, os, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np, torch
from tokenspeed_lit.kv_pool import PagedKVPool
from tokenspeed_lit.host_mirror import FlatHostMirror
from tokenspeed_lit.l3_keys import L3Namespace
from tokenspeed_lit.l3 import L3Tier, L3Handle, LocalMooncake, MooncakeStore
from bench.l3 import scheduler_pass, serving_calls, settle   # the benchmark's: a scheduler's pass, a serving loop, 2 ms idle


class Null:
    "A store that answers every request at once and moves nothing."
    def register(self, b): pass
    def batch_exists(self, k): return [1] * len(k)
    def batch_get_into(self, k, b, o, s): return list(s)
    def batch_put_from(self, k, b, o, s): return [0] * len(k)
    def close(self): pass


class Sleep(Null):
    "A store whose get and put take `seconds` (Mooncake's, measured first) and move nothing."
    def __init__(self, seconds): self.seconds = seconds
    def batch_get_into(self, k, b, o, s): time.sleep(self.seconds); return list(s)
    def batch_put_from(self, k, b, o, s): time.sleep(self.seconds); return [0] * len(k)


PIECES = ('check_pages', 'check_keys', 'check_keys_plain', 'handle', 'submit_get', 'put', 'get')


def profile(name, tier, keys, plain, src, dst, iters, device):
    h = tier.put(src, keys); h.wait(); h.wait_released()
    f = dict(check_pages=lambda: tier._check_pages(src), check_keys=lambda: tier._check_keys(keys, 256),
             check_keys_plain=lambda: tier._check_keys(plain, 256), handle=lambda: (L3Handle(tier, 'get', keys, dst), None)[1],   # never submitted
             submit_get=lambda: tier._submit('get', list(keys), dst, set(dst.tolist())), put=lambda: tier.put(src, keys),
             get=lambda: tier.get(keys, dst))
    # 'serving': every piece made in a serving loop that never blocks on the tier (bench.l3.serving_calls)
    ns = serving_calls([f[p] for _ in range(iters) for p in PIECES], device)
    print('PROF', name, 'serving', {p: round(statistics.median(ns[i::len(PIECES)]) / 1e3, 1) for i, p in enumerate(PIECES)},
          flush=True)
    for mode in ('settled', 'hot', 'in_loop'):
        T = {}
        def tm(k, f, i):
            if mode == 'settled': settle()
            elif mode == 'in_loop': scheduler_pass(i)
            t0 = time.perf_counter_ns(); r = f(); T.setdefault(k, []).append(time.perf_counter_ns() - t0); return r
        for i in range(iters):
            for p in PIECES:
                h = tm(p, f[p], i)
                if isinstance(h, L3Handle): h.wait(); h.wait_released()
            gc.disable(); h = tm('get_nogc', f['get'], i); gc.enable(); h.wait(); h.wait_released()
        print('PROF', name, mode, {k: round(statistics.median(v) / 1e3, 1) for k, v in T.items()}, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--layers', type=int, default=32); ap.add_argument('--iters', type=int, default=31)
    args = ap.parse_args(argv)
    P = 512
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    pool = PagedKVPool(num_pages=P + 1, page_size=16, num_layers=args.layers, num_kv_heads=8, head_dim=128,
                       dtype=torch.bfloat16, device=dev)
    mirror = FlatHostMirror(pool, num_host_pages=P)
    ns = L3Namespace('m', mirror, salt=b'x')
    keys = ns.keys(list(range(16 * 256))); plain = list(keys)
    src, dst = np.arange(256), np.arange(256, 512)
    with LocalMooncake(int(1.3 * P * mirror.bytes_per_host_page())) as srv:
        mc = L3Tier(mirror, MooncakeStore(srv.master), ns)
        h = mc.put(src, keys); h.wait(); h.wait_released()
        t0 = time.perf_counter(); g = mc.get(keys, dst); g.wait(); g.wait_released(); get_s = time.perf_counter() - t0
        print(f'PROF mooncake get of 256 pages: {get_s * 1e3:.1f} ms', flush=True)
        for name, tier in (('null', L3Tier(mirror, Null(), ns)), ('sleep', L3Tier(mirror, Sleep(get_s), ns)),
                           ('mooncake', mc)):
            profile(name, tier, keys, plain, src, dst, args.iters, dev)
            tier.close()
    sys.stdout.flush(); os._exit(0)   # no interpreter teardown: Mooncake's destructors once hung at exit


if __name__ == '__main__':
    main()
