"""Where a decode step's host time goes in a serving loop (issue 29): each piece of the staged decode path, and the
alternatives to it, timed alone right after an engine's work (a scheduler's Python pass over 4000 requests, a
sampler's small ops, matrix products queued on the GPU), one piece per step, pieces interleaved; then each piece
repeated at once (hot). Medians in us.

    python tools/decode_probe.py --batch 64     # prints lines starting with PROBE

The mixed rows time a step of 3 prefill chunks (110 tokens each) and 61 decode rows, whole and in pieces. On the
H200 (2026-12-01, three runs of this code): `fill_input_buffers` took 72, 105 and 71 us in the loop, the same step
through the named checks 88, 125 and 75 us; `pack_lists` (now `stage_lists`, with the header) alone 26, 32 and 18 us; the replay of copy, kernel and
positions 17, - and 12 us. The middle run was a slow spell of the host (its staged decode took 69 us against 51 and 36).

Measured on the H200 (2026-12-01, batch 64, 60 samples; the host's speed drifts by up to 1.5x between runs, so only
rows of one run compare): the graph of copy, event and kernel took 23.4 us to launch, the same graph without the
event node 10.6 us, a graph of one kernel 9.4 us; a `cudaEventSynchronize` of a completed event 11-14 us, the done
flag's read (with the rest of `decode_slot`) 3 us; Triton's launch of the fill kernel through `FastLaunch` 42-61 us.
A forward graph of 40 kernels replayed in 14.4 us, the same with the step's copy and kernel inside 11.1 us. So the
ring lost its event node (the kernel writes a done flag instead) and a decode step can ride in the engine's graph.
"""
import argparse, statistics, struct, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np, torch
from tokenspeed_lit.device import as_device, is_accel
from tokenspeed_lit.streams import synchronize
from tokenspeed_lit.input_buffers import InputBuffers, RuntimeStates, ForwardOp
from tokenspeed_lit.launch import FastLaunch
from tokenspeed_lit.graphs import capture
from tokenspeed_lit import fused_decode as fd
from bench.serving_loop import _Req, _between_steps


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--samples', type=int, default=40)
    a = ap.parse_args(argv)
    dev = as_device(None)
    B, POOL, COLS, PAGE = a.batch, 4096, 256, 16
    rng = np.random.default_rng(0)
    rs = RuntimeStates(POOL, 32000, output_length=1, device=dev)
    rs.valid_cache_lengths.copy_(torch.as_tensor(rng.integers(1, COLS * PAGE // 2, POOL + 1), dtype=torch.int32))
    table = torch.as_tensor(rng.integers(1, 1 << 20, (POOL + 1, COLS)), dtype=torch.int32, device=dev)
    ib = InputBuffers(1024, 8192, PAGE, 0, POOL, dev)
    step = ib.step
    step.bind(rs.valid_cache_lengths, rs.future_input_map, rs.remote_spec_candidate_ready, rs.vocab_size, table)
    pools = rng.choice(POOL, B, replace=False).tolist()
    sl = ib.decode_slot(); sl.req_pool_indices[:B] = pools; ib.fill_staged_decode(sl, B, rs, table)
    synchronize(dev)
    s = 0
    step.header(s, B, 0, 0, 1, B, False, False)
    fill, stage = FastLaunch(fd._fill_kernel), FastLaunch(fd._stage_kernel)
    args = step._args
    for _ in range(3):
        fill(step.grid, *args, WP=step._wp); stage((fd._STAGE_PROGRAMS,), step._slots[s], step._dev, step._slots[s], step.layout["end"],
                                                   AT=fd._STAGED, BLOCK=fd._STAGE_BLOCK, ONCE=False)
    synchronize(dev)
    pinned = step._np[s]
    packer = struct.Struct(f'={B}i')
    reqs = [_Req(i) for i in range(4000)]
    dt = torch.bfloat16 if is_accel(dev) else torch.float32
    n = 2048 if is_accel(dev) else 64
    x = torch.randn(n, n, dtype=dt, device=dev); y = torch.empty_like(x)
    logits = torch.randn(B, 32000, device=dev)
    small = torch.randn(64, 64, device=dev); out = torch.empty_like(small)
    fwd = lambda: [torch.mm(small, small, out=out) for _ in range(40)]
    g_fwd = capture(fwd, dev, direct=True)
    g_both = capture(lambda: (step._issue(2), fwd()), dev, direct=True)    # the step's copy and kernel inside the forward
    one = capture(lambda: torch.mm(small, small, out=out), dev, direct=True)
    step.header(2, B, 0, 0, 1, B, False, False)
    fill_only = capture(lambda: fd._fill_kernel[step.grid](*args, WP=step._wp), dev, direct=True)
    synchronize(dev)

    g_cap = capture(lambda: (ib.issue_captured(), fwd()), dev, direct=True)    # an engine's graph carrying the step

    def staged(captured=False):
        def run():
            q = ib.decode_slot(captured); q.put(pools); ib.fill_staged_decode(q, B, rs, table)
        return run
    E, n_pre = 3, 110                        # a mixed step: 3 prefill chunks of 110 tokens, the rest decode rows
    ids = rng.integers(0, 32000, E * n_pre).tolist()
    mop = ForwardOp(request_ids=list(range(B)), request_pool_indices=pools, input_lengths=[n_pre] * E + [1] * (B - E),
                    input_ids=ids, shifted_input_ids=ids[1:] + [7], extend_prefix_lens=[0] * E,
                    prefill_lengths=[2 * n_pre] * E, decode_input_ids=[-1] * (B - E))
    MT = E * n_pre + B - E

    def named_mixed():                      # the same step through the named checks (what _fill_usual leaves)
        st = ib._bound_step(rs, table, 'pool')
        b, e, p, l = ib._check_step(mop, MT, st.width)
        ib._fill_mixed(mop, b, e, MT, st.width, table, p, l, 'pool')

    cands = {
        'noop': lambda: None,
        'mixed step: fill_input_buffers': lambda: ib.fill_input_buffers(mop, rs, table, MT),
        'mixed step: the named checks': named_mixed,
        'mixed: stage_lists': lambda: step.stage_lists(s, pools, None, [n_pre] * E, [0] * E, ids, ids, E * n_pre, 1, MT),
        'graph launch (copy, kernel, positions)': lambda: step.launch(s, prefill=True),
        'staged decode (ring): slot, put, fill_staged_decode': staged(),
        'staged decode (in the graph): the same, no launch': staged(True),
        'decode_slot (done flag, views)': ib.decode_slot,
        'numpy write from list': lambda: sl.req_pool_indices.__setitem__(slice(0, B), pools),
        'struct pack_into': lambda: packer.pack_into(pinned, 4 * step.layout['pool'], *pools),
        'check_pools': lambda: step.check_pools(s, B),
        'header': lambda: step.header(s, B, 0, 0, 1, B, False, False),
        'bind check (_bound_step)': lambda: ib._bound_step(rs, table, 'pool'),
        'graph launch (copy, kernel): launch(s)': lambda: step.launch(s),
        'graph launch (fill kernel)': fill_only.replay,
        'graph launch (one mm)': one.replay,
        'fast launch fill kernel': lambda: fill(step.grid, *args, WP=step._wp),
        'fast launch stage + fill': lambda: (stage((fd._STAGE_PROGRAMS,), step._slots[s], step._dev, step._slots[s], step.layout["end"],
                                                  AT=fd._STAGED, BLOCK=fd._STAGE_BLOCK, ONCE=False), fill(step.grid, *args, WP=step._wp)),
        'forward graph (40 kernels)': g_fwd.replay,
        'forward graph + step inside': g_both.replay,
    }
    if is_accel(dev): cands['raw stream handle'] = lambda: torch._C._cuda_getCurrentRawStream(0)
    names = list(cands)
    got = {n: [] for n in names}
    clk = time.perf_counter_ns
    k = 0
    for r in range(a.samples):
        for n in names:
            k += 1
            _between_steps(reqs, k, logits, x, y, 2)
            f = cands[n]
            t0 = clk(); f(); t1 = clk()
            got[n].append((t1 - t0) / 1e3)
            if 'in the graph' in n: g_cap.replay()            # the engine's replay runs the staged step
            if k % 8 == 0: synchronize(dev)
    hot = {}
    for n in names:
        f = cands[n]; f(); ts = []
        for _ in range(20):
            t0 = clk(); f(); ts.append((clk() - t0) / 1e3)
            if 'in the graph' in n: g_cap.replay()
        hot[n] = statistics.median(ts)
        synchronize(dev)
    print(f'PROBE device={torch.cuda.get_device_name() if is_accel(dev) else "cpu"} torch={torch.__version__} batch={B}')
    for n in names:
        print(f'PROBE {n:40s} in loop {statistics.median(got[n]):7.2f}  p90 {np.percentile(got[n], 90):7.2f}  '
              f'hot {hot[n]:7.2f}')


if __name__ == '__main__':
    main()
