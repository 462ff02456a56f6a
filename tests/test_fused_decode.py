"""Property tests of `tokenspeed_lit.staging.fused_decode` (the staging ring's own: `test_staging_ring.py`): `fused_decode_input_prep` equals its plain-torch reference and the
unfused path; `FusedDecodeStep` equals `decode_step_ref` on random sequences of steps (verify widths 1-4, overrides with
and without ready candidates, ids outside the vocabulary, null pages, cached lengths past the page table, batch sizes
going up and down, Mamba indices), starting each step from poisoned buffers and a poisoned device staging area;
captured replays equal eager steps; the staging copy moves exactly the ints its header names; every bad input raises
`ValueError` before any buffer or runtime state is touched. Bad device values too: negative and huge cached lengths,
pool indices outside the pool, page sizes that are not powers of two; `fused_decode_input_prep`'s outputs sit inside
larger poisoned buffers whose guard bands must stay untouched; the step's lists come as lists, tuples, numpy arrays
or CPU tensors; duplicate pool rows, floats and narrow dtypes are refused; the debug mode names the request."""
import os
import re
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tokenspeed_lit.core.device import default_device, host_full
from tokenspeed_lit.core.streams import synchronize
from tokenspeed_lit.core.contract import device_value_checks
from tokenspeed_lit.staging.fused_decode import (fused_decode_input_prep, fused_decode_input_prep_ref,
                                                 decode_input_prep_unfused, FusedDecodeStep, decode_step_ref)
from tokenspeed_lit.core.graphs import capture
from tokenspeed_lit.staging.padding import PaddedBuffers
from tokenspeed_lit.staging import fused_decode as fd

from conftest import DEV, guarded as _guarded, assert_guards, random_table, kernel_examples
POISON, GUARD = -77, 5
guarded = lambda n, dtype: _guarded(n, dtype, POISON, GUARD)
KERNEL = settings(max_examples=kernel_examples(100))   # kernel properties: 100 examples on a GPU (conftest's profiles)
KERNEL_50 = settings(max_examples=kernel_examples(50))  # kernel properties at a GPU's default count, CI's under `ci`
PAGE_SIZES = st.sampled_from([1, 2, 3, 4, 5, 16])


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@KERNEL
@given(batch=st.sampled_from([0, 1]) | st.integers(0, 150), L=st.integers(0, 4), rows=st.integers(1, 12),
       cols=st.integers(1, 6), page_size=PAGE_SIZES, dummy=st.integers(0, 3),
       seed=st.integers(0, 2**31 - 1), slack=st.integers(0, 5), dtypes=st.sampled_from([torch.int32, torch.int64]),
       bad_cache=st.booleans())
def test_prep_matches_reference(batch, L, rows, cols, page_size, dummy, seed, slack, dtypes, bad_cache):
    g = _gen(seed)
    table = random_table(g, rows, cols)
    vcl = torch.randint(0, cols * page_size + 4, (rows,), generator=g, dtype=torch.int32)
    if bad_cache:   # negative and huge cached lengths: device values the host never sees
        vcl[torch.rand(rows, generator=g) < 0.3] = torch.tensor(-5, dtype=torch.int32)
        vcl[torch.rand(rows, generator=g) < 0.2] = torch.tensor(2**31 - 8, dtype=torch.int32)
    pools = torch.randint(-2, rows + 3, (batch,), generator=g)           # some outside the pool
    lbuf, loc = guarded(batch * L + slack, dtypes)
    pbuf, pos = guarded(batch * L + slack, torch.int64)
    sbuf, seq = guarded(batch + slack, torch.int64 if dtypes == torch.int32 else torch.int32)
    fused_decode_input_prep(loc, pos, seq, pools.to(DEV), vcl.to(DEV), L, table.to(DEV), page_size, dummy)
    ref = fused_decode_input_prep_ref(pools, vcl, L, table, page_size, dummy)
    for got, want, buf in zip((loc, pos, seq), ref, (lbuf, pbuf, sbuf)):
        assert torch.equal(got[:want.numel()].cpu().long(), want.to(got.dtype).long())
        assert (got[want.numel():] == POISON).all(), 'wrote past the batch'
        assert_guards(buf, POISON, GUARD)
    # every slot is the dummy or inside a page the row owns
    for i, s in enumerate(ref[0].tolist()):
        if s != dummy:
            assert s // page_size in table[int(pools[i // L])].tolist()


@given(batch=st.integers(1, 80), L=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_prep_matches_unfused(batch, L, seed):
    g = _gen(seed)
    table = random_table(g, 10, 5).to(DEV)
    vcl = torch.randint(0, 24, (10,), generator=g, dtype=torch.int32).to(DEV)
    pools = torch.randint(0, 10, (batch,), generator=g).to(DEV)
    a = [torch.empty(batch * L, dtype=torch.int32, device=DEV), torch.empty(batch * L, dtype=torch.int64, device=DEV),
         torch.empty(batch, dtype=torch.int32, device=DEV)]
    b = [torch.empty_like(t) for t in a]
    fused_decode_input_prep(*a, pools, vcl, L, table, 4, 1)
    decode_input_prep_unfused(*b, pools, vcl, torch.full((batch,), L, dtype=torch.int32, device=DEV), table, 4, 1)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# ---- the fused step ----------------------------------------------------------------------------------------------

def make_state(g, pool_rows, W, vocab, cols=4, page_size=4, bad_cache=False):
    vcl = torch.randint(0, cols * page_size + 2, (pool_rows,), generator=g, dtype=torch.int32)
    if bad_cache:   # negative cached lengths: the kernel must stay inside its buffers and match the reference
        vcl[torch.rand(pool_rows, generator=g) < 0.3] = torch.tensor(-3, dtype=torch.int32)
    fim = torch.randint(-3, vocab + 6, (pool_rows, W), generator=g, dtype=torch.int32)   # some out of range
    ready = torch.rand(pool_rows, generator=g) < 0.5
    table = random_table(g, pool_rows, cols)
    table[0] = 0
    return [t.to(DEV) for t in (vcl, fim, ready, table)]


@st.composite
def decode_steps(draw, max_bs, max_tok, W, pool_rows, vocab, has_mamba):
    B = draw(st.integers(0, min(max_bs, pool_rows - 1)))
    L = draw(st.integers(1, W))
    B = min(B, max_tok // L)
    pools = draw(st.permutations(list(range(1, pool_rows))))[:B]
    ids = st.one_of(st.just(-1), st.integers(-3, vocab + 10))
    ovr = draw(st.none() | st.lists(ids, min_size=B, max_size=B))
    mamba = None
    if has_mamba and draw(st.booleans()):
        mamba = [draw(st.lists(st.integers(-1, 50), min_size=B, max_size=B)) for _ in range(4)]
    form = draw(st.sampled_from([list, tuple, np.array, torch.tensor]))   # every accepted form of a host list
    return pools, L, ovr, mamba, form


@st.composite
def step_cases(draw):
    max_bs = draw(st.sampled_from([1, 3, 8, 70]))
    W = draw(st.integers(1, 4))
    max_tok = max_bs * draw(st.integers(1, 4))
    has_mamba = draw(st.booleans())
    pool_rows = max_bs + draw(st.integers(1, 6))
    vocab = draw(st.integers(2, 60))
    steps = draw(st.lists(decode_steps(max_bs, max_tok, W, pool_rows, vocab, has_mamba), min_size=1, max_size=3))
    page_size, bad_cache = draw(PAGE_SIZES), draw(st.booleans())
    return max_bs, max_tok, W, has_mamba, pool_rows, vocab, steps, page_size, bad_cache, draw(st.integers(0, 2**31 - 1))


def _form(form, values):
    return None if values is None else form(values) if form is not np.array else np.array(values, dtype=np.int64)


@KERNEL
@given(step_cases())
def test_step_matches_reference(case):
    max_bs, max_tok, W, has_mamba, pool_rows, vocab, steps, page_size, bad_cache, seed = case
    step = FusedDecodeStep.create(max_bs, max_tok, page_size, dummy_kv_slot=3,
                                  state_write_padding_pool_index=pool_rows, device=DEV, has_mamba=has_mamba)
    vcl, fim, ready, table = make_state(_gen(seed), pool_rows, W, vocab, page_size=page_size, bad_cache=bad_cache)
    step.bind(vcl, fim, ready, vocab, table)
    for pools, L, ovr, mamba, form in steps:
        step.buffers.poison_(POISON)   # the device staging area too: a step must copy all its kernel reads
        before = {k: v.cpu() for k, v in step.buffers.snapshot().items()}
        want, want_state = decode_step_ref(before, step.buffers.values, vcl.cpu(), fim.cpu(), ready.cpu(), vocab,
                                           table.cpu(), page_size, pools, L, ovr, mamba)
        got_ovr = step(_form(form, pools), L, _form(form, ovr),
                       None if mamba is None else [_form(form, m) for m in mamba])
        synchronize(DEV)
        assert got_ovr == (None if ovr is None or all(x == -1 for x in ovr) else ovr)
        for k, v in step.buffers.buffers().items():
            assert torch.equal(v.cpu(), want[k]), k
        for t, w in zip((vcl, fim, ready), want_state):
            assert torch.equal(t.cpu(), w)


def test_big_then_small_leaves_only_padding():
    g = _gen(0)
    vcl, fim, ready, table = make_state(g, 12, 2, 30)
    step = FusedDecodeStep.create(8, 16, 4, dummy_kv_slot=5, state_write_padding_pool_index=11, device=DEV,
                                  has_mamba=True).bind(vcl, fim, ready, 30, table)
    step(list(range(1, 9)), 2, [7] * 8, [[1] * 8] * 4)
    step([4], 1)
    synchronize(DEV)
    b, v = step.buffers, step.buffers.values
    for name in ['input_ids_buf', 'shifted_prefill_ids_buf', 'positions_buf', 'out_cache_loc_buf']:
        assert (getattr(b, name)[1:] == v[name]).all(), name
    assert (b.mrope_positions_buf[:, 1:] == 0).all()
    for name in ['input_lengths_buf', 'req_pool_indices_buf', 'state_write_req_pool_indices_buf', 'seq_lens_buf',
                 'force_single_token_verify_buf', 'mamba_pool_indices_buf', 'mamba_track_pool_indices_buf']:
        assert (getattr(b, name)[1:] == v[name]).all(), name
    assert (b.extend_prefix_lens_buf == 0).all() and (b.extend_seq_lens_buf == 0).all()
    assert (b.mamba_cow_src_indices_buf == -1).all()        # this step carried no Mamba indices


@given(batch=st.integers(0, 6), tokens_per_req=st.integers(0, 4))
def test_dummy_decode(batch, tokens_per_req):
    step = FusedDecodeStep.create(6, 24, 4, dummy_kv_slot=2, state_write_padding_pool_index=9, device=DEV)
    step.buffers.poison_(POISON)
    step.dummy(batch, batch * tokens_per_req)
    synchronize(DEV)
    b, v = step.buffers, step.buffers.values
    seq = max(tokens_per_req, 1) if batch else 1
    assert b.seq_lens_buf.tolist() == [seq] * batch + [1] * (6 - batch)
    for name, t in b.buffers().items():
        if name not in ('seq_lens_buf', 'mrope_positions_buf'):
            assert (t == v[name]).all(), name
    assert (b.mrope_positions_buf == 0).all()


@KERNEL_50
@given(st.lists(st.tuples(st.lists(st.integers(1, 9), min_size=0, max_size=4, unique=True), st.integers(1, 2),
                          st.booleans()), min_size=1, max_size=4), st.integers(0, 2**31 - 1))
def test_capture_replay_equals_eager(steps, seed):
    "A step from lists staged for an engine graph and replayed equals the same step launched on the ring."
    vocab = 40
    state = make_state(_gen(seed), 10, 2, vocab)
    eager_state = [t.clone() for t in state]
    cap = FusedDecodeStep.create(4, 8, 4, dummy_kv_slot=1, state_write_padding_pool_index=10, device=DEV)
    eag = FusedDecodeStep.create(4, 8, 4, dummy_kv_slot=1, state_write_padding_pool_index=10, device=DEV)
    cap.bind(state[0], state[1], state[2], vocab, state[3])
    eag.bind(eager_state[0], eager_state[1], eager_state[2], vocab, eager_state[3])
    graph = capture(cap.issue_captured, DEV)             # an engine's graph that starts with the step
    for pools, L, with_ovr in steps:
        ovr = [(p * 7) % (vocab + 5) - 1 for p in pools] if with_ovr else None
        cap(pools, L, ovr, captured=True)
        graph.replay()
        eag(pools, L, ovr)
        synchronize(DEV)
        for k, v in cap.buffers.buffers().items():
            assert torch.equal(v, eag.buffers.buffers()[k]), k
        for a, b in zip(state[:3], eager_state[:3]):
            assert torch.equal(a, b)


@KERNEL
@given(step_cases())
def test_step_inside_an_engine_graph_matches_reference(case):
    "Staged into the capture slot and run by an engine graph's replay (issue_captured), a step is decode_step_ref's."
    max_bs, max_tok, W, has_mamba, pool_rows, vocab, steps, page_size, bad_cache, seed = case
    step = FusedDecodeStep.create(max_bs, max_tok, page_size, dummy_kv_slot=3,
                                  state_write_padding_pool_index=pool_rows, device=DEV, has_mamba=has_mamba)
    vcl, fim, ready, table = make_state(_gen(seed), pool_rows, W, vocab, page_size=page_size, bad_cache=bad_cache)
    step.bind(vcl, fim, ready, vocab, table)
    graph = capture(step.issue_captured, DEV)            # an engine's graph that starts with the step
    for pools, L, ovr, mamba, form in steps:
        step.buffers.poison_(POISON)
        before = {k: v.cpu() for k, v in step.buffers.snapshot().items()}
        want, want_state = decode_step_ref(before, step.buffers.values, vcl.cpu(), fim.cpu(), ready.cpu(), vocab,
                                           table.cpu(), page_size, pools, L, ovr, mamba)
        sl = step.decode_slot(captured=True)
        B = len(pools)
        sl.req_pool_indices[:B] = pools
        sl.decode_input_ids[:B] = [-1] * B if ovr is None else ovr
        if mamba is not None: sl.mamba[:, :B] = np.array(mamba)
        has = step.issue_staged_decode(sl, B, L, overrides=ovr is not None, mamba=mamba is not None)
        assert has == (ovr is not None and any(x != -1 for x in ovr) and B > 0)
        graph.replay(); synchronize(DEV)
        for k, v in step.buffers.buffers().items():
            assert torch.equal(v.cpu(), want[k]), k
        for t, w in zip((vcl, fim, ready), want_state):
            assert torch.equal(t.cpu(), w)


def _setup():
    g = _gen(1)
    vcl, fim, ready, table = make_state(g, 6, 2, 100)
    step = FusedDecodeStep.create(4, 6, 4, dummy_kv_slot=0, state_write_padding_pool_index=6, device=DEV)
    return step.bind(vcl, fim, ready, 100, table), (vcl, fim, ready, table)


_BAD_STEPS = [
    (lambda s, st: s([1, 2, 3, 4, 5], 1), 'larger than max_bs=4'),
    (lambda s, st: s([1, 2], 3), 'uniform_input_length must be an integer in [1, 2]'),
    (lambda s, st: s([1, 2], 0), 'uniform_input_length must be an integer in [1, 2]'),
    (lambda s, st: s([1, 2, 3, 4], 2), '4 x 2 tokens exceed max_num_tokens=6'),
    (lambda s, st: s([1, 6], 1), 'req_pool_indices holds 6, outside the pool [0, 6)'),
    (lambda s, st: s([-1, 2], 1), 'req_pool_indices holds -1'),
    (lambda s, st: s([1, 2**40], 1), 'req_pool_indices must hold int32 integers'),
    (lambda s, st: s([1, 2], 1, [5]), 'decode_input_ids has 1 entries for 2 decode rows'),
    (lambda s, st: s([1, 2], 1, [5, -2**40]), 'decode_input_ids must hold int32 integers'),
    (lambda s, st: s([1, 2], 1, None, [[0, 0]] * 4), 'no Mamba buffers'),
    (lambda s, st: s.dummy(5, 0), 'batch_size must be an integer in [0, 4], got 5'),
    (lambda s, st: s.dummy(2.0, 0), 'batch_size must be an integer, got 2.0'),
    (lambda s, st: s.dummy(1, 2.5), 'total_tokens must be an integer, got 2.5'),
    (lambda s, st: s([3, 1, 3], 1), 'req_pool_indices holds pool row 3 twice (requests 0 and 2)'),
    (lambda s, st: s((2, 2), 1), 'req_pool_indices holds pool row 2 twice (requests 0 and 1)'),
    (lambda s, st: s(np.array([1, 4, 1]), 1), 'req_pool_indices holds pool row 1 twice'),
    (lambda s, st: s([1, 2], 1.0), 'uniform_input_length must be an integer, got 1.0'),
    (lambda s, st: s([1, 2], True), 'uniform_input_length must be an integer, got True'),
    (lambda s, st: s([1.0, 2.0], 1), 'req_pool_indices must hold int32 integers'),
    (lambda s, st: s(np.array([1.0, 2.0]), 1), 'req_pool_indices must hold integers, got dtype float64'),
    (lambda s, st: s(torch.tensor([1.0, 2.0]), 1), 'req_pool_indices must hold integers, got dtype torch.float32'),
    (lambda s, st: s({1, 2}, 1), 'req_pool_indices must be a list, tuple, numpy array or CPU tensor'),
    (lambda s, st: s(3, 1), 'req_pool_indices must be a list, tuple, numpy array or CPU tensor of integers, got int'),
    (lambda s, st: s(np.array([[1, 2]]), 1), 'req_pool_indices must be 1-D, got shape (1, 2)'),
    (lambda s, st: s([1, 2], 1, np.array([5, 6.5])), 'decode_input_ids must hold integers, got dtype float64'),
    (lambda s, st: s([1, 2], 1, [5, 6.5]), 'decode_input_ids must hold int32 integers'),
    (lambda s, st: s.bind(st[0], st[1].short(), st[2], 100, st[3]), 'future_input_map must be int32 or int64'),
    (lambda s, st: s.bind(st[0], st[1], st[2], 100.0, st[3]), 'vocab_size must be an integer, got 100.0'),
    (lambda s, st: s.dummy(1, 7), 'total_tokens must be an integer in [0, 6], got 7'),
    (lambda s, st: s.bind(st[0], st[1], st[2], 1, st[3]), 'vocab_size must be an integer >= 2'),
    (lambda s, st: s.bind(st[0][:5], st[1], st[2], 100, st[3]), 'one entry per pool row'),
    (lambda s, st: s.bind(st[0], st[1], st[2].int(), 100, st[3]), 'remote_spec_candidate_ready must be a 1-D torch.bool'),
    (lambda s, st: s.bind(st[0].float(), st[1], st[2], 100, st[3]), 'valid_cache_lengths must have an integer dtype'),
    (lambda s, st: s.bind(st[0], st[1][:, :0], st[2], 100, st[3]), 'at least one column'),
    (lambda s, st: s.bind(st[0], st[1], st[2], 100, st[3][:, :0]), 'req_to_page must have at least one row'),
    (lambda s, st: s.bind(st[0][::2], st[1][::2], st[2][::2], 100, st[3]), 'must be contiguous'),
    (lambda s, st: s.bind(st[0], st[1], st[2], 100, st[3].flatten()), 'req_to_page must have 2 dimension'),
]


@pytest.mark.parametrize('call, msg', _BAD_STEPS)
def test_bad_step_input_touches_nothing(call, msg):
    step, state = _setup()
    step([1, 2], 2, [9, -1])
    synchronize(DEV)
    bufs = step.buffers.snapshot()
    before = [t.clone() for t in state]
    with pytest.raises(ValueError, match=msg.replace('[', r'\[').replace(']', r'\]').replace('(', r'\(')
                       .replace(')', r'\)')):
        call(step, state)
    synchronize(DEV)
    for k, v in step.buffers.buffers().items():
        assert torch.equal(v, bufs[k]), k
    for a, b in zip(state, before):
        assert torch.equal(a, b)
    step([3], 1)                       # and the step still works


def prep(out_cache_loc, positions, seq_lens_out):
    "fused_decode_input_prep of two pool rows (width 2, page size 4) into the given outputs."
    return fused_decode_input_prep(out_cache_loc, positions, seq_lens_out, torch.zeros(2, dtype=torch.int64, device=DEV),
                                   torch.zeros(2, dtype=torch.int32, device=DEV), 2,
                                   torch.ones(2, 2, dtype=torch.int32, device=DEV), 4)


@pytest.mark.parametrize('call, msg', [
    (lambda: FusedDecodeStep.create(2, 4, 4, device=DEV)([1], 1), 'bind the step'),
    (lambda: FusedDecodeStep(PaddedBuffers(2, 4, 0, 0, device=DEV), 4), 'buffers.scratch has 0 int32'),
    (lambda: FusedDecodeStep.create(2, 4, 0, device=DEV), 'page_size must be a positive integer'),
    (lambda: FusedDecodeStep.create(2, 4, 4.0, device=DEV), 'page_size must be a positive integer, got 4.0'),
    (lambda: prep(*[torch.empty(4, dtype=torch.int16, device=DEV)] * 3), 'out_cache_loc must be int32 or int64, got torch.int16'),
    (lambda: prep(*[torch.empty(4, dtype=torch.int32, device=DEV)] * 3), 'positions must be int64, got torch.int32'),
    (lambda: prep(torch.empty(4, dtype=torch.int32, device=DEV), torch.empty(4, dtype=torch.int64, device=DEV),
                  torch.empty(2, dtype=torch.uint8, device=DEV)), 'seq_lens_out must be int32 or int64, got torch.uint8'),
    (lambda: prep(*[torch.empty(2, dtype=torch.int32, device=DEV)] * 3), 'out_cache_loc has 2 elements'),
])
def test_bad_construction(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_debug_mode_names_the_request():
    step, (vcl, fim, ready, table) = _setup()
    vcl[4] = -2
    step([1, 4], 1)                          # off: memory-safe and silent
    with device_value_checks():
        with pytest.raises(ValueError, match=r'request 1: valid_cache_lengths\[4\] = -2, must be >= 0'):
            step([1, 4], 1)
        step([1, 2], 1)                      # good values pass
        o = [torch.empty(2, dtype=torch.int32, device=DEV), torch.empty(2, dtype=torch.int64, device=DEV),
             torch.empty(2, dtype=torch.int32, device=DEV)]
        with pytest.raises(ValueError, match='requests 0 and 1 share pool row 3'):
            fused_decode_input_prep(*o, torch.tensor([3, 3], device=DEV), vcl, 1, table, 4)
        with pytest.raises(ValueError, match=r'request 0: req_pool_indices\[0\] = 6, must be in \[0, 6\)'):
            fused_decode_input_prep(*o, torch.tensor([6, 3], device=DEV), vcl, 1, table, 4)


# ---- batch-ordered tables (issue 16): identical to the pool-ordered call on the equivalent table -----------------

def batch_rows_of(table, pools, g, rows=None):
    "A batch-ordered table: row i is pool row pools[i] of `table` (garbage for a pool index outside it, and past B)."
    rows = max(rows or 0, len(pools), 1)
    bt = random_table(g, rows, table.shape[1]).to(table.device)
    for i, p in enumerate(pools.tolist() if isinstance(pools, torch.Tensor) else pools):
        if 0 <= p < table.shape[0]: bt[i] = table[p]
    return bt


@given(batch=st.sampled_from([0, 1]) | st.integers(0, 60), L=st.integers(1, 4), rows=st.integers(1, 10),
       page_size=PAGE_SIZES, seed=st.integers(0, 2**31 - 1))
def test_prep_batch_order_equals_pool_order(batch, L, rows, page_size, seed):
    g = _gen(seed)
    table = random_table(g, rows, 5)
    vcl = torch.randint(-2, 5 * page_size + 4, (rows,), generator=g, dtype=torch.int32)
    pools = torch.randint(-2, rows + 2, (batch,), generator=g)            # some outside the pool: dummy either way
    bt = batch_rows_of(table, pools, g)
    outs = []
    for order, tbl in (('pool', table), ('batch', bt)):
        o = [torch.full((batch * L,), -1, dtype=torch.int32, device=DEV),
             torch.full((batch * L,), -1, dtype=torch.int64, device=DEV), torch.full((batch,), -1, device=DEV)]
        fused_decode_input_prep(*o, pools.to(DEV), vcl.to(DEV), L, tbl.to(DEV), page_size, 3, table_order=order)
        outs.append(o)
    ref = fused_decode_input_prep_ref(pools, vcl, L, bt, page_size, 3, table_order='batch')
    for x, y, r in zip(*outs, ref):
        assert torch.equal(x, y) and torch.equal(x.cpu().long(), r)


@KERNEL_50
@given(step_cases())
def test_step_batch_order_equals_pool_order(case):
    "Two steps, one bound to the pool table, one to a persistent batch table rewritten before each step: equal."
    max_bs, max_tok, W, has_mamba, pool_rows, vocab, steps, page_size, bad_cache, seed = case
    mk = lambda: FusedDecodeStep.create(max_bs, max_tok, page_size, dummy_kv_slot=3,
                                        state_write_padding_pool_index=pool_rows, device=DEV, has_mamba=has_mamba)
    a, b = mk(), mk()
    sa = make_state(_gen(seed), pool_rows, W, vocab, page_size=page_size, bad_cache=bad_cache)
    sb = [t.clone() for t in sa]
    bt = torch.zeros(max_bs, sa[3].shape[1], dtype=torch.int32, device=DEV)   # the scheduler's batch table
    a.bind(*sa[:3], vocab, sa[3])
    b.bind(*sb[:3], vocab, bt, table_order='batch')
    for pools, L, ovr, mamba, form in steps:
        bt.copy_(batch_rows_of(sa[3], pools, _gen(seed), max_bs)[:max_bs])
        a(pools, L, ovr, mamba)
        b(pools, L, ovr, mamba)
        synchronize(DEV)
        for k, v in a.buffers.buffers().items():
            assert torch.equal(v, b.buffers.buffers()[k]), k
        for x, y in zip(sa, sb):
            assert torch.equal(x, y)


@pytest.mark.parametrize('order', ['pool', 'batch'])
def test_hole_policy_on_the_fused_paths(order):
    "A page id <= 0 and a column past the table's width give the dummy slot on both fused paths, in both orders."
    table = torch.tensor([[0, 0], [3, -1], [5, 0], [6, 7]], dtype=torch.int32, device=DEV)   # row 3: a full row
    pools, vcl = torch.tensor([1, 2, 3], device=DEV), torch.tensor([0, 2, 2, 6], dtype=torch.int32, device=DEV)
    tbl = table if order == 'pool' else table[[1, 2, 3]]
    loc = torch.empty(9, dtype=torch.int32, device=DEV)
    fused_decode_input_prep(loc, torch.empty(9, dtype=torch.int64, device=DEV), torch.empty(3, device=DEV, dtype=torch.int32),
                            pools, vcl, 3, tbl, 4, 9, table_order=order)
    # row 1 at 2..4: page 3 (14, 15), then the hole -1; row 2 at 2..4: page 5 (22, 23), then the null page 0;
    # row 3 at 6..8: page 7 (30, 31), then column 2: past the width
    want = [14, 15, 9, 22, 23, 9, 30, 31, 9]
    assert loc.tolist() == want
    step = FusedDecodeStep.create(4, 12, 4, dummy_kv_slot=9, state_write_padding_pool_index=3, device=DEV)
    fim = torch.ones(4, 3, dtype=torch.int32, device=DEV)
    bt = table if order == 'pool' else torch.cat([table[[1, 2, 3]], table[:1]])
    step.bind(vcl, fim, torch.zeros(4, dtype=torch.bool, device=DEV), 10, bt, table_order=order)
    step([1, 2, 3], 3)
    synchronize(DEV)
    assert step.buffers.out_cache_loc_buf[:9].tolist() == want


def test_batch_order_host_checks():
    step = FusedDecodeStep.create(4, 8, 4, device=DEV)
    z = torch.zeros(3, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"req_to_page has 2 rows, max_bs=4 needed \(table_order='batch'\)"):
        step.bind(z, z.view(3, 1), z.bool(), 10, torch.ones(2, 2, dtype=torch.int32, device=DEV), table_order='batch')
    with pytest.raises(ValueError, match="table_order must be 'pool' or 'batch'"):
        step.bind(z, z.view(3, 1), z.bool(), 10, torch.ones(4, 2, dtype=torch.int32, device=DEV), table_order='row')
    with pytest.raises(ValueError, match=r"req_to_page has 1 rows, 2 needed \(table_order='batch'\)"):
        fused_decode_input_prep(z[:2], z[:2].long(), z[:2], z[:2], z, 1, z.view(1, 3), 4, table_order='batch')


@pytest.mark.skipif(bool(os.environ.get('TOKENSPEED_LIT_SANITIZER')),
                    reason="compute-sanitizer with host backtraces (gpu_suite.py --sanitize --backtraces) keeps every "
                           "launch's Python frames, and so the step")
def test_a_dropped_step_is_freed_without_the_garbage_collector():
    "The step's captured ring slots do not refer back to it: dropping the last reference frees it (and its buffers)."
    import gc, weakref
    step = FusedDecodeStep.create(4, 8, 4, device=DEV)
    alive = weakref.ref(step)
    was = gc.isenabled()
    gc.disable()
    try:
        del step
        left = alive()
        if left is not None:     # name what still holds it (frames by function, cells, dicts by their keys)
            refs = [type(r).__name__ + (f' {r.f_code.co_name}:{r.f_lineno}' if hasattr(r, 'f_code') else
                                        f' keys {[k for k, v in r.items() if v is left][:3]}' if isinstance(r, dict) else '')
                    for r in gc.get_referrers(left)]
            del left
            pytest.fail(f'the dropped step is still referred to by {refs}')
    finally:
        if was: gc.enable()
