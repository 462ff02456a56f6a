"""A step's input preparation, this tree against another revision, in one process and one loop, step by step alternately.

The host's speed moves by 2x and more between runs on a shared machine, within a run too, so even runs paired
back to back (`tools/demo_ab.py`, `tools/loop_ab.py`) disagree by more than the difference they look for. Here the
baseline revision's package is imported under another name (`tokenspeed_lit_base`: a `git archive` of it, renamed;
the package imports itself relatively) beside this tree's, each with its own `InputBuffers`, runtime state, table and
engine graph, and one serving loop (a scheduler's Python pass, a sampler's ops and queued matrix products between
steps: `bench/serving_loop.py`) alternates between them every step: both sides see the same host.

    python tools/prep_ab.py --base f88625b --out bench/results/prep_ab.json
    python tools/prep_ab.py --base-dir /tmp/base      # a directory holding the baseline's tokenspeed_lit/

Cases: a decode step staged for the engine's graph (`captured=True`, then the graph's replay) at several batch sizes,
the same step launched from a ring slot (`captured=False`), and a mixed step. Prints the medians and new/base, and
exits non-zero if the two sides' buffers differ after a case's last step (both staged the same step)."""
import argparse, importlib, json, os, shutil, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / 'tools'))


def load_base(base: str, base_dir: str | None, tmp: Path):
    """The baseline's `input_buffers` module, imported as `tokenspeed_lit_base.input_buffers` (a revision of the flat
    layout, before the package's subpackages) or `tokenspeed_lit_base.staging.input_buffers` (one after)."""
    from demo_ab import export_revision
    src = Path(base_dir).resolve() if base_dir else export_revision(base, tmp / 'export')
    shutil.copytree(src / 'tokenspeed_lit', tmp / 'tokenspeed_lit_base')
    sys.path.insert(0, str(tmp))
    flat = (tmp / 'tokenspeed_lit_base' / 'input_buffers.py').exists()
    return importlib.import_module('tokenspeed_lit_base.input_buffers' if flat else 'tokenspeed_lit_base.staging.input_buffers')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--base', default='origin/main')
    ap.add_argument('--base-dir')
    ap.add_argument('--steps', type=int, default=600, help='steps per side and case')
    ap.add_argument('--batches', type=int, nargs='+', default=[1, 64, 256])
    ap.add_argument('--only', help='only the cases whose name holds this text (e.g. captured)')
    ap.add_argument('--small', action='store_true', help='a pool of 1024 rows, max_bs 256, 1024 tokens, 512x512 products: for a CPU, whose interpreted kernels and products are slow (the default: 4096, 1024, 8192, 2048x2048)')
    ap.add_argument('--out')
    args = ap.parse_args(argv)
    import torch
    from bench.serving_loop import _Req, _between_steps
    from bench.host_overhead import _mixed_op
    from bench.timing import env_info
    import tokenspeed_lit.staging.input_buffers as new
    from tokenspeed_lit.core.graphs import capture
    from tokenspeed_lit.core.streams import synchronize
    from tokenspeed_lit.core.device import default_device
    import numpy as np
    dev = default_device()
    with tempfile.TemporaryDirectory() as d:
        base = load_base(args.base, args.base_dir, Path(d))
        POOL, COLS, PAGE, MAX_BS, MAX_TOK = (1024, 64, 16, 256, 1024) if args.small else (4096, 256, 16, 1024, 8192)
        rng = np.random.default_rng(0)
        cache = torch.as_tensor(rng.integers(1, COLS * PAGE // 2, POOL + 1), dtype=torch.int32)
        table = torch.as_tensor(rng.integers(1, 1 << 20, (POOL + 1, COLS)), dtype=torch.int32, device=dev)

        def side(M):
            rs = M.RuntimeStates(POOL, 32000, output_length=1, device=dev)
            rs.valid_cache_lengths.copy_(cache)
            ib = M.InputBuffers(MAX_BS, MAX_TOK, PAGE, 0, POOL, dev)
            ib.fill_input_buffers(M.ForwardOp([], [], []), rs, table, 0)
            return dict(M=M, rs=rs, ib=ib, graph=capture(ib.issue_captured, dev))
        sides = dict(base=side(base), new=side(new))
        reqs = [_Req(i) for i in range(4000)]
        n = 512 if args.small else 2048                     # the queued matrix products between steps
        x = torch.randn(n, n, dtype=torch.bfloat16 if dev.type == 'cuda' else torch.float32, device=dev)
        y = torch.empty_like(x)
        L = 128 if args.small else 512                      # the mixed step's prefill rows: 4 of L tokens
        cases = [(f'decode {B}, captured', B, True, None) for B in args.batches] + \
                [(f'decode {B}, ring slot', B, False, None) for B in args.batches] + [(f'mixed 4x{L}+60', 64, False, (4, L, 60))]
        cases = [c for c in cases if args.only is None or args.only in c[0]]
        rows, clk, k, differ = [], time.perf_counter_ns, 0, []
        for name, B, captured, mixed in cases:
            logits = torch.randn(B, 32000, device=dev)
            if mixed:
                fo, T = _mixed_op(new.ForwardOp, rng, POOL, *mixed, 100, COLS * PAGE - mixed[1] - 1)
                for s in sides.values():
                    s['rs'].valid_cache_lengths[torch.as_tensor(fo.request_pool_indices[:mixed[0]], device=dev)] = \
                        torch.as_tensor(fo.extend_prefix_lens, dtype=torch.int32, device=dev)
            pools = [int(p) for p in rng.choice(np.arange(1, POOL), B, replace=False)]
            times = dict(base=[], new=[])
            for i in range(2 * args.steps):
                k += 1
                who = ('base', 'new')[i % 2]
                s, M = sides[who], sides[who]['M']
                _between_steps(reqs, k, logits, x, y, 2)
                if mixed: op = M.ForwardOp(**{f: getattr(fo, f) for f in ('request_ids', 'request_pool_indices', 'input_lengths', 'input_ids', 'shifted_input_ids', 'extend_prefix_lens', 'prefill_lengths')})
                else: op = M.ForwardOp(list(range(B)), list(pools), [1] * B)
                T = sum(op.input_lengths)
                t0 = clk(); s['ib'].fill_input_buffers(op, s['rs'], table, T, captured=captured); t1 = clk()
                times[who].append((t1 - t0) / 1e3)
                if captured: s['graph'].replay()
                if k % 16 == 0: synchronize(dev)
            synchronize(dev)                     # both staged the same step last: the same buffers
            bb, nb = sides['base']['ib'].buffers(), sides['new']['ib'].buffers()
            same = bb.keys() == nb.keys() and all(torch.equal(bb[n], nb[n]) for n in bb)
            if not same: differ.append(name)
            b, n = statistics.median(times['base']), statistics.median(times['new'])
            rows.append(dict(step=name, base_us=round(b, 2), new_us=round(n, 2), new_over_base=round(n / b, 3),
                             same_buffers=same))
            print(f'{name:28s} base {b:7.2f} us   new {n:7.2f} us   new/base {n / b:.3f}', flush=True)
    e = env_info(dev)
    rep = dict(base=args.base, sizes=dict(pool=POOL, max_bs=MAX_BS, max_num_tokens=MAX_TOK), machine=f"{e['device']} | torch {e['torch']} | triton {e['triton']}", env=e, steps=args.steps,
               rows=rows)
    if args.out: Path(args.out).write_text(json.dumps(rep, indent=1))
    if differ: sys.exit(f'the two sides staged different buffers: {", ".join(differ)}')


if __name__ == '__main__':
    main()
