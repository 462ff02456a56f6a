"""Where the L3 tier's caller time goes (issue 26): the caller's part of `L3Tier.put/get` for 256 host pages of
2 MiB (page size 16, 32 layers K+V 8 x 128 bf16), piece by piece, against a store that does nothing and against a
real Mooncake client (a LocalMooncake master and store process), hot and after a 2 ms sleep. Medians in us.

    python tools/l3_caller_profile.py        # a GPU machine (pinned host pages); prints lines starting with PROF

Measured on the H200 (2026-12-01): with no store the whole call is 37-41 us hot; with Mooncake's client in the
process every piece is slower (the page check 58 us against 11 us)."""
import time, statistics, numpy as np, torch, sys, gc
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parent.parent))
from tokenspeed_lit.kv_pool import PagedKVPool
from tokenspeed_lit.host_mirror import FlatHostMirror
from tokenspeed_lit.l3_keys import L3Namespace
from tokenspeed_lit.l3 import L3Tier, L3Handle, LocalMooncake, MooncakeStore
P = 512
pool = PagedKVPool(num_pages=P + 1, page_size=16, num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, device='cuda' if torch.cuda.is_available() else 'cpu')
mirror = FlatHostMirror(pool, num_host_pages=P)
ns = L3Namespace('m', mirror, salt=b'x')
keys = ns.keys(list(range(16 * 256))); plain = list(keys)
src = np.arange(256); dst = np.arange(256, 512)
class Null:
    def register(self, b): pass
    def batch_exists(self, k): return [1]*len(k)
    def batch_get_into(self, k, b, o, s): return list(s)
    def batch_put_from(self, k, b, o, s): return [0]*len(k)
    def close(self): pass
def settle():
    time.sleep(0.002)
    end = time.perf_counter() + 0.0005
    while time.perf_counter() < end: pass
with LocalMooncake(int(1.3 * P * mirror.bytes_per_host_page())) as srv:
    for name, store in (('null', Null()), ('mooncake', MooncakeStore(srv.master))):
        tier = L3Tier(mirror, store, ns)
        h = tier.put(src, keys); h.wait(); h.wait_released()
        for mode in ('settled', 'hot'):
            T = {}
            def tm(k, f):
                if mode == 'settled': settle()
                t0 = time.perf_counter_ns(); r = f(); T.setdefault(k, []).append(time.perf_counter_ns() - t0); return r
            for i in range(31):
                tm('check_pages', lambda: tier._check_pages(src)); tm('check_keys', lambda: tier._check_keys(keys, 256))
                tm('check_keys_plain', lambda: tier._check_keys(plain, 256)); tm('handle', lambda: L3Handle(tier, 'get', keys, dst))
                h = tm('submit_get', lambda: tier._submit('get', list(keys), dst)); h.wait(); h.wait_released()
                h = tm('put', lambda: tier.put(src, keys)); h.wait(); h.wait_released()
                h = tm('get', lambda: tier.get(keys, dst)); h.wait(); h.wait_released()
                gc.disable(); h = tm('get_nogc', lambda: tier.get(keys, dst)); gc.enable(); h.wait(); h.wait_released()
            print('PROF', name, mode, {k: round(statistics.median(v)/1e3, 1) for k, v in T.items()}, flush=True)
        tier.close()
sys.stdout.flush(); __import__('os')._exit(0)   # no interpreter teardown: Mooncake's destructors once hung at exit
