"""Where a cold step's host time goes: small candidates timed as the first thing of a step inside `make demo`'s loop.

The demo's `_prep` is replaced. Each step times one candidate (round robin: decode steps for the graph over `dnames`,
steps with prefill rows over `mnames`), right after the loop's own work, then the real `fill_input_buffers` fills the
buffers untimed (the `real` and `flat*` candidates fill them themselves), so every check of the demo still runs.

    python tools/cold_probe.py [--requests 512 --arrivals 4 --max-output 64]    # prints lines starting with PROBE
    PROBE_NAMES=real,noop,pack_slot2 python tools/cold_probe.py                  # a chosen set, on every step

Measured on the H200 (2026-12-02, torch 2.11, triton 3.6, Python 3.12.3 with `_struct` built in; 512 requests, 323
steps; medians of 15 steps with prefill rows, in us; an empty timed call 0.32):

| candidate | us | what it runs |
|---|---|---|
| `pack_slot2` | 9.9 | one `struct.pack_into` of the step's pool indices and overrides into the pinned capture slot |
| `pack_mvB` / `pack_bytes` | 8.7 / 8.1 | the same pack into a memoryview, and to bytes (no buffer at all) |
| `hdr_mvB` | 7.8 | a `struct` pack of the 18 header ints |
| `mv_loop` / `mv_hdr` | 7.0 / 2.8 | the same lists / header ints stored one by one through the slot's int32 memoryview |
| `getbuf` | 4.9 | `memoryview(ndarray)`: numpy's buffer export |
| `ids_pinned` | 5.6 | a numpy slice copy of the step's prompt ids into pinned memory |
| `minmax` / `set` | 3.7 / 4.5 | `min(pools) >= 0 and max(pools) < n` / `len(set(pools))` |
| `done_read` | 2.7 | two reads of the done flags (pinned, written by the device) |
| `call4` / `ctypes` | 0.9 / 12.6 | an empty Python function of 4 arguments / a ctypes call of libc's `abs` |
| `launch_direct` | 30.9 | a captured one-op graph, `cuGraphLaunch` through ctypes (`graphs.capture(direct=True)`) |
| `launch_bindings` / `launch_torch` | 32.5 / 33.8 | the same through cuda-bindings / `torch.cuda.CUDAGraph.replay` |
| `eager_add` | 33.2 | an eager in-place add on 8 floats (a later run: every launch costs about 30 us cold) |

Decode steps for the graph, same run (7-8 steps each): the package's `fill_input_buffers` of then 42.1 us; its checks
written as one function with two `struct` packs (`flat`, from `tools/prep_ab.py`) 31.6; one `struct` pack of the
header, its static fields and the lists (`flat_one`) 39.3; one int32 store per int (`flat_mv`) 29.2. So repeated at
once `struct` is the faster (a CPU: 2.3 us for 128 ints, 10.5 stored one by one), but in the loop its first call
of a step costs 8-10 us whatever it packs: the code, not the ints. The package now stores short lists and the header
one by one, and the decode step for the graph calls nothing inside `fill_input_buffers`.

Then `make demo --no-l3` on the H200, the session's first code (72e1993) and this one in turn, in one device call
(medians in us, in the loop): decode 43 and 41 against 24 and 18; mixed 89 and 109 against 90 and 71. The decode step
halves; the mixed step's figure moves with the host more than with the code (its replay alone is ~30 us cold).
"""
import argparse, statistics, struct, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np, torch
from tokenspeed_lit import demo
from tokenspeed_lit.device import host_full
from tokenspeed_lit.graphs import capture
clk = time.perf_counter_ns

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prep_ab import flat_decode
from tokenspeed_lit.fused_decode import _HEADER
from tokenspeed_lit.input_buffers import ForwardOp
from tokenspeed_lit import contract as _contract

def _test(ib, op, rs, table, total):
    step = ib.step
    c, m, r, t, v, by_batch = step._state
    pools, lens, ovr = op.request_pool_indices, op.input_lengths, op.decode_input_ids
    B, W, done = len(pools), step.width, step._done_mv
    try:
        ok = (step.bound and rs.valid_cache_lengths is c and rs.future_input_map is m and rs.remote_spec_candidate_ready
            is r and table is t and rs.vocab_size == v and by_batch and type(op) is ForwardOp and type(pools) is list
            and type(lens) is list and type(total) is int and not op.extend_prefix_lens and not op.prefill_lengths
            and not len(op.input_ids) and not len(op.shifted_input_ids) and (ovr is None or type(ovr) is list and len(ovr) == B)
            and type(op.request_ids) is list and len(op.request_ids) == B == len(lens) and 0 < B <= step.max_bs
            and total == B * W and op.mamba_pool_indices is None and op.mamba_cow_src_indices is None
            and op.mamba_branching_seqlens is None and op.mamba_track_pool_indices is None
            and not _contract.CHECK_DEVICE_VALUES and done[3] <= step._reran and done[2] >= step._tickets[2]
            and step._captured_at == step._binds and lens.count(W) == B
            and min(pools) >= 0 and max(pools) < step.num_pool and len(set(pools)) == B)
    except TypeError: ok = False
    return ok

def flat_mv(ib, op, rs, table, total):
    if not _test(ib, op, rs, table, total): return ib.fill_input_buffers(op, rs, table, total, 'batch', captured=True)
    step, pools, ovr = ib.step, op.request_pool_indices, op.decode_input_ids
    B, W = len(pools), step.width
    if ovr is not None and ovr.count(-1) == B: ovr = None
    m, o = step._mv[2], _HEADER
    try:
        for x in pools: m[o] = x; o += 1
        if ovr is not None:
            for x in ovr: m[o] = x; o += 1
    except (ValueError, TypeError): return ib.fill_input_buffers(op, rs, table, total, 'batch', captured=True)
    tk = step._ticket = step._ticket + 1
    step._tickets[2] = tk
    m[0] = B; m[1] = 0; m[2] = 0; m[3] = W; m[4] = total; m[5] = ovr is not None; m[6] = 0; m[7] = 0; m[8] = 1
    m[9] = _HEADER; m[10] = _HEADER + B; m[11] = o; m[12] = o; m[13] = o; m[14] = o; m[15] = o; m[16] = 2; m[17] = tk
    ib.all_extends_mid_chunk = False
    return ovr

_ONE = {}
def flat_one(ib, op, rs, table, total):
    if not _test(ib, op, rs, table, total): return ib.fill_input_buffers(op, rs, table, total, 'batch', captured=True)
    step, pools, ovr = ib.step, op.request_pool_indices, op.decode_input_ids
    B, W = len(pools), step.width
    if ovr is not None and ovr.count(-1) == B: ovr = None
    if 'tail' not in _ONE:
        _ONE['tail'] = tuple(step._np[2][18:_HEADER].tolist()); _ONE['mv'] = memoryview(step._np[2]).cast('B')
    n = B if ovr is None else 2 * B
    p = _ONE.get(n)
    if p is None: p = _ONE[n] = struct.Struct(f'={_HEADER + n}i')
    tk = step._ticket + 1
    e = _HEADER + n
    try:
        if ovr is None: p.pack_into(_ONE['mv'], 0, B, 0, 0, W, total, 0, 0, 0, 1, _HEADER, _HEADER + B, e, e, e, e, e, 2, tk, *_ONE['tail'], *pools)
        else: p.pack_into(_ONE['mv'], 0, B, 0, 0, W, total, 1, 0, 0, 1, _HEADER, _HEADER + B, e, e, e, e, e, 2, tk, *_ONE['tail'], *pools, *ovr)
    except struct.error: return ib.fill_input_buffers(op, rs, table, total, 'batch', captured=True)
    step._ticket = step._tickets[2] = tk
    ib.all_extends_mid_chunk = False
    return ovr

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--requests', type=int, default=512)
    ap.add_argument('--arrivals', type=int, default=4)
    ap.add_argument('--max-output', type=int, default=64)
    a = ap.parse_args()
    got = {}
    st = {}
    def rec(n, ns): got.setdefault(n, []).append(ns / 1e3)
    def empty4(a, b, c, d): return None
    def setup(self):
        step = self.bufs.step
        n = step._np[2].size
        st['plain'] = np.zeros(n, dtype=np.int32)
        st['pinned'] = host_full((n,), 0, torch.int32).numpy()
        st['hdr'] = struct.Struct('=18i')      # the per-step header fields
        x = torch.zeros(8, device=self.device)
        st['x'] = x
        st['g_direct'] = capture(lambda: x.add_(1), self.device, direct=True)
        st['g_torch'] = capture(lambda: x.add_(1), self.device, direct=False)
        st['structs'] = {}
        from tokenspeed_lit.driver import cu
        if cu is not None:
            gd = st['g_direct']
            st['bind'] = (cu.cuGraphLaunch, cu.CUgraphExec(gd._launch[1]), cu.CUstream(torch.cuda.current_stream().cuda_stream))
        else: st['bind'] = (lambda g, s: None, None, None)
        st['pinned_mv'] = memoryview(st['pinned'])
        import ctypes; st['ctypes'] = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int)(ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p).value)
        st['slot2B'] = memoryview(step._np[2]).cast('B')
        st['pinnedB'] = memoryview(st['pinned']).cast('B')
    counter = [0]
    names = ('real', 'noop', 'call4', 'minmax', 'set', 'tuple', 'pack_slot2', 'pack_plain', 'pack_pinned',
             'hdr_plain', 'hdr_pinned', 'stream', 'launch_direct', 'launch_torch', 'done_read', 'ids_plain', 'ids_pinned',
             'mv_loop', 'mv_map', 'mv_hdr')
    import os
    dnames = ('real', 'flat', 'flat_mv', 'flat_one', 'noop')
    mnames = ('real', 'noop', 'pack_slot2', 'pack_mvB', 'pack_bytes', 'mv_loop', 'mv_hdr', 'hdr_mvB', 'getbuf', 'minmax',
              'set', 'done_read', 'launch_direct', 'launch_torch', 'launch_bindings', 'stream', 'ids_pinned', 'ctypes', 'call4')
    if os.environ.get('PROBE_NAMES'): dnames = mnames = tuple(os.environ['PROBE_NAMES'].split(','))
    dcount = [0]
    def _prep(self, op, total, decode, captured=False):
        ib, rs, tb = self.bufs, self.states, self.batch_table
        if not st: setup(self)
        step = ib.step
        real = lambda: ib.fill_input_buffers(op, rs, tb, total, table_order='batch', captured=captured)
        c = dcount if captured else counter
        k = c[0] = c[0] + 1
        nm = dnames if captured else mnames
        n = nm[k % len(nm)]
        kind = 'D' if captured else 'M'
        pools = op.request_pool_indices
        two = op.decode_input_ids or pools
        m = m_ = len(pools) + len(two)
        p = st['structs'].get(m)
        if p is None: p = st['structs'][m] = struct.Struct(f'={m}i')
        hdr, ids = st['hdr'], op.input_ids
        if n in ('stream', 'launch_direct', 'launch_torch', 'launch_bindings', 'eager_add') and not torch.cuda.is_available(): real(); return
        if n == 'real':
            t0 = clk(); real(); t1 = clk(); rec(f'{kind} real', t1 - t0)
            if captured: B = len(op.request_ids); rec(f'{kind} real B{"<=16" if B <= 16 else "17-48" if B <= 48 else ">48"}', t1 - t0)
            return
        if n in ('flat', 'flat_mv', 'flat_one'):
            if not captured: real(); return
            f = dict(flat=flat_decode, flat_mv=flat_mv, flat_one=flat_one)[n]
            t0 = clk(); f(ib, op, rs, tb, total); t1 = clk(); rec(f'{kind} {n}', t1 - t0)
            B = len(op.request_ids); rec(f'{kind} {n} B{"<=16" if B <= 16 else "17-48" if B <= 48 else ">48"}', t1 - t0); return
        elif n == 'noop': t0 = clk(); t1 = clk()
        elif n == 'call4': t0 = clk(); empty4(op, rs, tb, total); t1 = clk()
        elif n == 'minmax': t0 = clk(); min(pools) >= 0 and max(pools) < 99999; t1 = clk()
        elif n == 'set': t0 = clk(); len(set(pools)); t1 = clk()
        elif n == 'tuple': t0 = clk(); (*pools, *two); t1 = clk()
        elif n == 'pack_slot2': a = step._np[2]; t0 = clk(); p.pack_into(a, 256, *pools, *two); t1 = clk()
        elif n == 'pack_plain': a = st['plain']; t0 = clk(); p.pack_into(a, 256, *pools, *two); t1 = clk()
        elif n == 'pack_pinned': a = st['pinned']; t0 = clk(); p.pack_into(a, 256, *pools, *two); t1 = clk()
        elif n == 'hdr_plain': a = st['plain']; t0 = clk(); hdr.pack_into(a, 0, *range(18)); t1 = clk()
        elif n == 'hdr_pinned': a = st['pinned']; t0 = clk(); hdr.pack_into(a, 0, *range(18)); t1 = clk()
        elif n == 'stream': t0 = clk(); torch._C._cuda_getCurrentRawStream(0); t1 = clk()
        elif n == 'launch_direct': g = st['g_direct']; t0 = clk(); g.replay(); t1 = clk()
        elif n == 'launch_bindings':
            f, g, sm = st['bind']; t0 = clk(); f(g, sm); t1 = clk()
        elif n == 'eager_add':
            x = st['x']; t0 = clk(); x.add_(1); t1 = clk()
        elif n == 'launch_torch': g = st['g_torch'].graph; t0 = clk(); g.replay(); t1 = clk()
        elif n == 'done_read': d = step._done_mv; t0 = clk(); d[2] + d[3]; t1 = clk()
        elif n in ('ids_plain', 'ids_pinned'):
            if not len(ids): real(); return
            a = st['plain' if n == 'ids_plain' else 'pinned']
            t0 = clk(); a[:len(ids)] = ids; t1 = clk()
        elif n == 'mv_loop':
            m = step._mv[2]; t0 = clk()
            i = 64
            for v in pools: m[i] = v; i += 1
            for v in two: m[i] = v; i += 1
            t1 = clk()
        elif n == 'mv_map':
            m = step._mv[2]; t0 = clk()
            any(map(m.__setitem__, range(64, 64 + len(pools)), pools)); any(map(m.__setitem__, range(64 + len(pools), 64 + m_), two))
            t1 = clk()
        elif n == 'mv_hdr':
            m = st['pinned_mv']; t0 = clk()
            m[0] = 1; m[1] = 2; m[2] = 3; m[3] = 4; m[4] = 5; m[5] = 6; m[6] = 7; m[7] = 8; m[8] = 9; m[9] = 10
            m[10] = 11; m[11] = 12; m[12] = 13; m[13] = 14; m[14] = 15; m[15] = 16; m[16] = 17; m[17] = 18
            t1 = clk()
        elif n == 'pack_mvB':
            m = st['slot2B']; t0 = clk(); p.pack_into(m, 256, *pools, *two); t1 = clk()
        elif n == 'pack_bytes':
            t0 = clk(); p.pack(*pools, *two); t1 = clk()
        elif n == 'hdr_mvB':
            m = st['slot2B']; t0 = clk(); hdr.pack_into(m, 0, *range(18)); t1 = clk()
        elif n == 'hdr_mv_pinned':
            m = st['pinnedB']; t0 = clk(); hdr.pack_into(m, 0, *range(18)); t1 = clk()
        elif n == 'ids_mv':
            if not len(ids): real(); return
            m = st['pinned_mv']; t0 = clk(); m[1000:1000 + len(ids)] = ids; t1 = clk()
        elif n == 'ctypes':
            f = st['ctypes']; t0 = clk(); f(5); t1 = clk()
        elif n == 'getbuf':
            a = step._np[2]; t0 = clk(); memoryview(a); t1 = clk()
        rec(f'{kind} {n}', t1 - t0)
        real()
    demo.Scheduler._prep = _prep
    cfg = demo.DemoConfig.for_device(requests=a.requests, arrivals_per_step=a.arrivals, repeat_prep=False, max_output=a.max_output)
    stats = demo.serve(cfg, progress=False)
    print(f'PROBE steps={stats["steps"]} graph_steps={stats["graph_steps"]} checks={stats["checks"]} {demo.machine_line()}')
    for n in sorted(got):
        xs = got[n]
        print(f'PROBE {n:18s} n={len(xs):4d} median {statistics.median(xs):7.2f} p25 {np.percentile(xs, 25):7.2f} p75 {np.percentile(xs, 75):7.2f}')

if __name__ == '__main__':
    main()
