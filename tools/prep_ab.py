"""Candidates for a step's input preparation, timed side by side inside `make demo`'s serving loop (issue 29).

The demo's `_prep` is replaced: each step times one candidate (round robin over the step's kind), cold, right after the
loop's own work, then runs the real `fill_input_buffers` untimed when the candidate did not stage the whole step, so
every check of the demo still runs on the real buffers. The stamped candidate records where its time goes.

    python tools/prep_ab.py                          # prints lines starting with AB

`noop` is the floor: an empty timed call. It also shows the host's speed, which moves between device calls. Measured on
the H200 (2026-12-02; medians over 3-7 steps per decode candidate, 38-46 per mixed one; only rows of one run compare):

| run (noop) | decode: real | flat (one function) | staged API | mixed: real | the parts of a mixed step (*) |
|---|---|---|---|---|---|
| `_fill_usual`, `pack_lists` + `header` (0.31 us) | 47.6 | 25.5 | 46.2 | 76.8 | bind 2.8, tests 7.5 + 11.8, slot 3.2, pack 22.2, header 4.5, launch 24.6 |
| `stage_lists`, admission by pages (0.79 us) | 45.6 | 32.2 | 71.6 | 107.7 | bind 4.3, tests 11.6 + 18.8, slot 5.3, stage_lists 37.8, launch 33.5 |
| and `_fill_graph_decode` (0.48 us) | 50.3 | 39.7 | 64.1 | 96.4 | bind 3.6, tests 9.1 + 16.3, slot 4.5, stage_lists 31.8, launch 27.9 |

(*) From a copy of `_fill_usual` with time stamps between its parts, since dropped: the demo times the calls inside
(`parts` in its report); the two tests were 7-12 and 12-19 us of a mixed step.

With `--requests 512 --arrivals 4`, the demo's scheduler before admission by pages deadlocked at step 3000: 78 decoding
requests held all 4096 pages, each waiting for one more. Admitted by pages, the same run finished in 258 steps.
"""
import argparse, statistics, struct, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
from tokenspeed_lit import demo
from tokenspeed_lit import contract as _contract
from tokenspeed_lit.input_buffers import ForwardOp
from tokenspeed_lit.fused_decode import _HEADER

clk = time.perf_counter_ns
_HDR = struct.Struct('=18i')     # the per-step header fields (the package now stores them one by one)


def flat_decode(ib, op, rs, table, total, ts=None):
    "A decode step for the graph in one function: the same checks as `_fill_usual`, two packs (header, lists)."
    step = ib.step
    c, m, r, t, v, by_batch = step._state
    pools, lens, ovr = op.request_pool_indices, op.input_lengths, op.decode_input_ids
    B, W, done = len(pools), step.width, step._done_mv
    if ts is not None: ts.append(clk())
    if not (step.bound and rs.valid_cache_lengths is c and rs.future_input_map is m and rs.remote_spec_candidate_ready
            is r and table is t and rs.vocab_size == v and by_batch and type(op) is ForwardOp and type(pools) is list
            and type(lens) is list and type(total) is int and not op.extend_prefix_lens and not op.prefill_lengths
            and not len(op.input_ids) and not len(op.shifted_input_ids) and (ovr is None or type(ovr) is list)
            and type(op.request_ids) is list and len(op.request_ids) == B == len(lens) and 0 < B <= step.max_bs
            and total == B * W and op.mamba_pool_indices is None and op.mamba_cow_src_indices is None
            and op.mamba_branching_seqlens is None and op.mamba_track_pool_indices is None
            and not _contract.CHECK_DEVICE_VALUES and done[3] <= step._reran and done[2] >= step._tickets[2]
            and step._captured_at == step._binds):
        return ib.fill_input_buffers(op, rs, table, total, 'batch', captured=True)
    if ts is not None: ts.append(clk())
    try:
        if not (lens.count(W) == B and (ovr is None or len(ovr) == B) and min(pools) >= 0 and max(pools) < step.num_pool
                and len(set(pools)) == B):
            return ib.fill_input_buffers(op, rs, table, total, 'batch', captured=True)
    except TypeError: return ib.fill_input_buffers(op, rs, table, total, 'batch', captured=True)
    if ovr is not None and ovr.count(-1) == B: ovr = None
    if ts is not None: ts.append(clk())
    n = B if ovr is None else 2 * B
    p = step._structs.get(n)
    if p is None: p = step._structs[n] = struct.Struct(f'={n}i')
    a = step._np[2]
    if ovr is None: p.pack_into(a, 4 * _HEADER, *pools)
    else: p.pack_into(a, 4 * _HEADER, *pools, *ovr)
    if ts is not None: ts.append(clk())
    tk = step._ticket = step._ticket + 1
    step._tickets[2] = tk
    e = _HEADER + n
    _HDR.pack_into(a, 0, B, 0, 0, W, total, ovr is not None, 0, 0, 1, _HEADER, _HEADER + B, e, e, e, e, e, 2, tk)
    ib.all_extends_mid_chunk = False
    if ts is not None: ts.append(clk())
    return ovr


DECODE_STAMPS = ('enter', 'test 1', 'test 2', 'pack', 'header')


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--requests', type=int, default=256)
    ap.add_argument('--arrivals', type=int, default=8)
    a = ap.parse_args(argv)
    got, parts = {}, {}

    def record(name, ns): got.setdefault(name, []).append(ns / 1e3)

    def stamps(name, ts, labels):
        d = parts.setdefault(name, {k: [] for k in labels})
        for k, t0, t1 in zip(labels, ts, ts[1:]): d[k].append((t1 - t0) / 1e3)

    counter = [0]

    def _prep(self, op, total, decode, captured=False):
        ib, rs, tb = self.bufs, self.states, self.batch_table
        real = lambda replace=False: ib.fill_input_buffers(op, rs, tb, total, table_order='batch', captured=captured,
                                                           replace=replace)
        k = counter[0] = counter[0] + 1
        if captured:
            names = ('real', 'flat', 'flat stamped', 'staged', 'noop')
            name = 'decode: ' + names[k % len(names)]
            n = name[8:]
            if n == 'real': t0 = clk(); real(); record(name, clk() - t0)
            elif n == 'flat': t0 = clk(); flat_decode(ib, op, rs, tb, total); record(name, clk() - t0)
            elif n == 'flat stamped':
                ts = [clk()]; flat_decode(ib, op, rs, tb, total, ts); record(name, ts[-1] - ts[0])
                stamps(name, ts, DECODE_STAMPS)
            elif n == 'staged':
                has = op.decode_input_ids is not None and any(x != -1 for x in op.decode_input_ids)
                t0 = clk(); sl = ib.decode_slot(captured=True)
                sl.put(op.request_pool_indices, op.decode_input_ids if has else None)
                ib.fill_staged_decode(sl, len(op.request_ids), rs, tb, table_order='batch', overrides=has)
                record(name, clk() - t0)
            else:
                t0 = clk(); record(name, clk() - t0); real()
        else:
            names = ('real', 'noop')
            name = ('decode (ring): ' if decode else 'mixed: ') + names[k % len(names)]
            n = name.split(': ')[1]
            if n == 'real': t0 = clk(); real(); record(name, clk() - t0)
            else: t0 = clk(); record(name, clk() - t0); real()

    demo.Scheduler._prep = _prep
    cfg = demo.DemoConfig.for_device(requests=a.requests, arrivals_per_step=a.arrivals, repeat_prep=False)
    made = []
    init = demo.Scheduler.__init__
    def keep(self, *a, **k): init(self, *a, **k); made.append(self)
    demo.Scheduler.__init__ = keep
    try: stats = demo.serve(cfg, progress=False)
    except demo.DemoViolation:
        import collections
        s = made[-1]
        print('AB stalled at step', s.step_no, 'states', dict(collections.Counter(r.state for r in s.requests[:s.arrived])),
              'free pages', s.pool.num_free, 'free rows', len(s.free_rows), 'host free', len(s.host_free))
        for r in s.live[:8]:
            print('AB  request', r.uid, r.state, 'prompt', r.prompt_len, 'cached', r.cache_len, 'output', r.output_len,
                  'tokens', len(r.tokens), 'pages', len(r.pages))
        raise
    print(f'AB steps={stats["steps"]} graph_steps={stats["graph_steps"]} checks={stats["checks"]} '
          f'machine={demo.machine_line()}')
    for name in sorted(got):
        xs = got[name]
        line = f'AB {name:30s} n={len(xs):4d} median {statistics.median(xs):7.2f} p90 {np.percentile(xs, 90):7.2f}'
        if name in parts: line += '  | ' + ', '.join(f'{k} {statistics.median(v):.1f}' for k, v in parts[name].items())
        print(line)


if __name__ == '__main__':
    main()
