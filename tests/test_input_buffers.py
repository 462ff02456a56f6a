"""Property tests of `tokenspeed_lit.staging.input_buffers` and `tokenspeed_lit.staging.padding`: `fill_input_buffers` equals the
plain-torch `fill_input_buffers_ref` on random sequences of prefill, mixed, decode and empty steps (verify widths 1-4,
overrides, ids outside the vocabulary, null pages, Mamba indices), starting each step from poisoned buffers; a big
step followed by a small one leaves every tail at its padding value; dummy decode; every bad input raises
`ValueError` and leaves the buffers and the runtime state untouched; the padding module's rules. Bad values too:
negative cached lengths (device values), page sizes that are not powers of two, lists given as tuples, numpy arrays or
CPU tensors; duplicate pool rows, stray prefill lists, Mamba lists without Mamba buffers, floats are refused."""
import re
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tokenspeed_lit.core.device import default_device
from tokenspeed_lit.core.streams import synchronize
from tokenspeed_lit.core.contract import device_value_checks
from contextlib import contextmanager
from unittest import mock
from tokenspeed_lit.staging.step_plan import ForwardOp
from tokenspeed_lit.staging.input_buffers import RuntimeStates, InputBuffers, fill_input_buffers_ref
from tokenspeed_lit.staging.step_plan import StepPlanner
from tokenspeed_lit.staging.padding import (PADDING, PaddedBuffers, padding_values, reset_tail, pick_capture_size,
                                            dummy_decode_seq_len, clamp_token_ids_)

DEV = default_device()
POISON = -77
MAMBA = ('mamba_pool_indices', 'mamba_cow_src_indices', 'mamba_branching_seqlens', 'mamba_track_pool_indices')
from conftest import kernel_examples
KERNEL = settings(max_examples=kernel_examples(80))   # the fill properties: 80 examples on a GPU (conftest's profiles)
KERNEL_50 = settings(max_examples=kernel_examples(50))  # kernel properties at a GPU's default count, CI's under `ci`
FORMS = (list, tuple, lambda v: np.array(v, dtype=np.int64), lambda v: torch.tensor(v, dtype=torch.int64))


def make_states(seed, pool_rows, W, vocab, cols=6, page_size=4, bad_cache=False):
    g = torch.Generator().manual_seed(seed)
    rs = RuntimeStates(pool_rows - 1, vocab, W, device=DEV)
    rs.valid_cache_lengths.copy_(torch.randint(0, cols * page_size + 3, (pool_rows,), generator=g, dtype=torch.int32))
    if bad_cache:   # negative cached lengths (device values): defined, memory-safe, equal to the reference
        rs.valid_cache_lengths[torch.rand(pool_rows, generator=g) < 0.3] = -2
    rs.future_input_map.copy_(torch.randint(-3, vocab + 5, (pool_rows, W), generator=g, dtype=torch.int32))
    rs.remote_spec_candidate_ready.copy_(torch.rand(pool_rows, generator=g) < 0.5)
    table = torch.randint(1, 400, (pool_rows, cols), generator=g, dtype=torch.int32)
    table[torch.rand(pool_rows, cols, generator=g) < 0.2] = torch.tensor(-1, dtype=torch.int32)
    table[torch.rand(pool_rows, cols, generator=g) < 0.1] = 0
    table[0] = 0
    return rs, table.to(DEV)


@st.composite
def forward_ops(draw, max_bs, max_tok, W, pool_rows, vocab, has_mamba):
    B = draw(st.integers(0, min(max_bs, pool_rows - 1)))
    ne = draw(st.sampled_from([0, B]) | st.integers(0, B))              # decode, prefill or mixed
    B = min(B, ne + max_tok // W)
    budget = max_tok - (B - ne) * W
    plens = draw(st.lists(st.integers(0, max(0, min(9, budget))), min_size=ne, max_size=ne))
    while sum(plens) > budget:
        plens[plens.index(max(plens))] -= 1
    P = sum(plens)
    pools = draw(st.permutations(list(range(1, pool_rows))))[:B]
    tok = st.integers(-3, vocab + 5)
    ids, shifted = (draw(st.lists(tok, min_size=P, max_size=P)) for _ in range(2))
    prefix = draw(st.lists(st.integers(0, 30), min_size=ne, max_size=ne))
    full = [p + n + draw(st.integers(0, 2)) for p, n in zip(prefix, plens)]
    ovr = draw(st.none() | st.lists(st.just(-1) | st.integers(-3, vocab + 9), min_size=B - ne, max_size=B - ne))
    mamba = {f: draw(st.lists(st.integers(-1, 40), min_size=B, max_size=B)) for f in MAMBA} \
        if has_mamba and draw(st.booleans()) else {}
    form = draw(st.sampled_from(FORMS))   # every accepted form of the op's lists
    f = lambda v: v if v is None else form(v)
    op = ForwardOp(list(range(B)), f(pools), f(plens + [W] * (B - ne)), f(ids), f(shifted), f(prefix), f(full), f(ovr),
                   **{k: f(v) for k, v in mamba.items()})
    ref_op = ForwardOp(list(range(B)), pools, plens + [W] * (B - ne), ids, shifted, prefix, full, ovr, **mamba)
    return op, ref_op, P + (B - ne) * W


@st.composite
def fill_cases(draw):
    max_bs = draw(st.sampled_from([1, 4, 9]))
    max_tok = max_bs * draw(st.integers(1, 5))
    W = draw(st.integers(1, 4))
    has_mamba = draw(st.booleans())
    pool_rows = max_bs + draw(st.integers(1, 5))
    vocab = draw(st.integers(2, 50))
    ops = draw(st.lists(forward_ops(max_bs, max_tok, W, pool_rows, vocab, has_mamba), min_size=1, max_size=4))
    page_size, bad_cache = draw(st.sampled_from([1, 3, 4, 5])), draw(st.booleans())
    return max_bs, max_tok, W, has_mamba, pool_rows, vocab, ops, page_size, bad_cache, draw(st.integers(0, 2**31 - 1))


def state_of(rs):
    return rs.valid_cache_lengths, rs.future_input_map, rs.remote_spec_candidate_ready


@KERNEL
@given(fill_cases())
def test_fill_matches_reference(case):
    max_bs, max_tok, W, has_mamba, pool_rows, vocab, ops, page_size, bad_cache, seed = case
    rs, table = make_states(seed, pool_rows, W, vocab, page_size=page_size, bad_cache=bad_cache)
    ib = InputBuffers(max_bs, max_tok, page_size, dummy_kv_slot=2, state_write_padding_pool_index=pool_rows - 1,
                      device=DEV, has_mamba=has_mamba)
    for op_in, op, total in ops:
        ib.poison_(POISON)   # the device staging area too: a step must copy everything its kernels read
        before = {k: v.cpu() for k, v in ib.snapshot().items()}
        want, want_state = fill_input_buffers_ref(before, ib.values, op, *[t.cpu() for t in state_of(rs)], vocab,
                                                  table.cpu(), total, page_size)
        got = ib.fill_input_buffers(op_in, rs, table, total)
        synchronize(DEV)
        ovr = op.decode_input_ids
        assert got == (None if ovr is None or all(x == -1 for x in ovr) else ovr)
        for k, v in ib.buffers().items():
            assert torch.equal(v.cpu(), want[k]), k
        for t, w in zip(state_of(rs), want_state):
            assert torch.equal(t.cpu(), w)
        ne = op.num_extends()
        assert ib.all_extends_mid_chunk == (ne > 0 and ne == len(op.request_ids) and all(
            p + n < f for p, n, f in zip(op.extend_prefix_lens, op.input_lengths, op.prefill_lengths)))


def _tails_are_padding(ib, batch, total, ne):
    for r in PADDING:
        if r.mamba and not ib.has_mamba:
            continue
        start = dict(tokens=total, rows=batch, extends=ne)[r.tail]
        assert (getattr(ib, r.name)[..., start:] == ib.values[r.name]).all(), r.name


@pytest.mark.parametrize('small', ['decode', 'mixed', 'empty'])
def test_big_then_small_leaves_every_tail_padded(small):
    rs, table = make_states(3, 12, 2, 50)
    ib = InputBuffers(8, 24, 4, dummy_kv_slot=1, state_write_padding_pool_index=11, device=DEV, has_mamba=True)
    big = ForwardOp(list(range(8)), list(range(1, 9)), [4, 2, 2, 2, 2, 2, 2, 2], [5] * 4, [6] * 4, [3], [10],
                    [7, -1, 8, -1, 9, -1, 10], *([[2] * 8] * 4))
    ib.fill_input_buffers(big, rs, table, 18)
    if small == 'decode':
        op, b, t, ne = ForwardOp([0], [3], [2], decode_input_ids=[4]), 1, 2, 0
    elif small == 'mixed':
        op, b, t, ne = ForwardOp([0, 1], [4, 3], [1, 2], [5], [6], [0], [1]), 2, 3, 1
    else:
        op, b, t, ne = ForwardOp([], [], []), 0, 0, 0
    ib.fill_input_buffers(op, rs, table, t)
    synchronize(DEV)
    _tails_are_padding(ib, b, t, ne)
    assert (ib.mamba_pool_indices_buf == -1).all()        # the small step carried no Mamba indices


@given(batch=st.integers(0, 5), per=st.integers(0, 4))
def test_dummy_decode(batch, per):
    rs, table = make_states(4, 8, 4, 50)
    ib = InputBuffers(5, 20, 4, dummy_kv_slot=3, state_write_padding_pool_index=7, device=DEV)
    ib.fill_input_buffers(ForwardOp([0, 1], [1, 2], [4, 4], decode_input_ids=[3, 4]), rs, table, 8)
    ib.fill_dummy_decode_buffers(batch, batch * per)
    synchronize(DEV)
    assert ib.seq_lens_buf.tolist() == [dummy_decode_seq_len(batch, batch * per)] * batch + [1] * (5 - batch)
    for name, t in ib.buffers().items():
        if name != 'seq_lens_buf':
            assert (t == ib.values[name]).all(), name


def test_rebinds_to_new_state():
    rs1, table = make_states(5, 8, 2, 50)
    rs2, _ = make_states(6, 8, 2, 50)
    ib = InputBuffers(4, 8, 4, dummy_kv_slot=0, state_write_padding_pool_index=7, device=DEV)
    op = ForwardOp([0, 1], [2, 5], [2, 2])
    for rs in (rs1, rs2, rs1):
        ib.fill_input_buffers(op, rs, table, 4)
        synchronize(DEV)
        assert ib.input_ids_buf[:4].tolist() == rs.future_input_map[[2, 5]].clamp(0, 49).flatten().tolist()


def _mixed(**kw):
    base = dict(request_ids=[0, 1], request_pool_indices=[3, 2], input_lengths=[3, 2], input_ids=[5, 6, 7],
                shifted_input_ids=[6, 7, 8], extend_prefix_lens=[0], prefill_lengths=[3])
    return ForwardOp(**{**base, **kw})


def _dec(pools, **kw):
    return ForwardOp(list(range(len(pools))), pools, [2] * len(pools), **kw)


_BAD = [
    (lambda: (_dec([1, 2, 3, 4, 5]), 10), 'batch of 5 requests is larger than max_bs=4'),
    (lambda: (_dec([1, 2]), 17), 'total_tokens=17 must be an integer in [0, max_num_tokens=16]'),
    (lambda: (_dec([1, 2]), -1), 'total_tokens=-1 must be an integer'),
    (lambda: (_dec([1, 2]), 5), 'total_tokens=5 differs from sum(input_lengths)=4'),
    (lambda: (_mixed(), 6), 'total_tokens=6 differs from sum(input_lengths)=5'),
    (lambda: (ForwardOp([0, 1], [1, 2], [2]), 2), 'per-request lists disagree'),
    (lambda: (ForwardOp([0], [1, 2], [2, 2]), 4), 'per-request lists disagree'),
    (lambda: (_dec([1, 9]), 4), 'request_pool_indices holds 9, outside the pool [0, 9)'),
    (lambda: (_dec([-3, 1]), 4), 'request_pool_indices holds -3'),
    (lambda: (_mixed(request_pool_indices=[3, 12]), 5), 'request_pool_indices holds 12'),
    (lambda: (_dec([1, 2], decode_input_ids=[5]), 4), 'decode_input_ids has 1 entries for 2 decode rows'),
    (lambda: (_mixed(decode_input_ids=[1, 2]), 5), 'decode_input_ids has 2 entries for 1 decode rows'),
    (lambda: (ForwardOp([0, 1], [1, 2], [1, 3]), 4), 'every decode row must feed 2 tokens'),
    (lambda: (ForwardOp([0, 1], [1, 2], np.array([1, 3])), 4), 'every decode row must feed 2 tokens'),   # arrays: one pass
    (lambda: (ForwardOp([0, 1], [1, 2], torch.tensor([2, 1], dtype=torch.int32)), 3), 'every decode row must feed 2'),
    (lambda: (ForwardOp([0, 1], np.array([1, 2]), np.array([2, 2], dtype=np.int32)), 5),
     'total_tokens=5 differs from sum(input_lengths)=4'),
    (lambda: (ForwardOp([0, 1, 2], [1, 2, 3], np.array([2, 2])), 4), 'per-request lists disagree'),
    (lambda: (_mixed(input_lengths=[3, 1]), 4), 'every decode row must feed 2 tokens'),
    (lambda: (_mixed(input_ids=[5, 6]), 5), 'input_ids has 2 entries, 3 expected'),
    (lambda: (_mixed(shifted_input_ids=[5, 6, 7, 8]), 5), 'shifted_input_ids has 4 entries, 3 expected'),
    (lambda: (_mixed(prefill_lengths=[]), 5), 'prefill_lengths has 0 entries, 1 expected'),
    (lambda: (_mixed(extend_prefix_lens=[0, 0, 0]), 5), '3 extend rows'),
    (lambda: (_mixed(extend_prefix_lens=[-1]), 5), 'extend_prefix_lens[0] = -1: a prefix length cannot be negative'),
    (lambda: (_mixed(input_lengths=[-1, 2], input_ids=[], shifted_input_ids=[]), 1),
     'input_lengths[0] = -1: a prefill row cannot have a negative length'),
    (lambda: (_mixed(input_lengths=[-1, 2]), 1), 'input_lengths[0] = -1'),
    (lambda: (_dec([3, 3]), 4), 'request_pool_indices holds pool row 3 twice (requests 0 and 1)'),
    (lambda: (_mixed(request_pool_indices=[2, 2]), 5), 'request_pool_indices holds pool row 2 twice'),
    (lambda: (_dec([1, 2], input_ids=[5, 6]), 4), 'input_ids has 2 entries, but the step has no prefill row'),
    (lambda: (_dec([1, 2], shifted_input_ids=[5]), 4), 'shifted_input_ids has 1 entries, but the step has no prefill'),
    (lambda: (_dec([1, 2], prefill_lengths=[9]), 4), 'prefill_lengths has 1 entries, but the step has no prefill row'),
    (lambda: (_dec([1, 2], mamba_pool_indices=[1, 2]), 4),
     'mamba_pool_indices given, but the buffers have no Mamba buffers'),
    (lambda: (_mixed(mamba_track_pool_indices=[1, 2]), 5), 'mamba_track_pool_indices given, but the buffers have no'),
    (lambda: (_dec([1, 2]), 4.0), 'total_tokens must be an integer, got 4.0'),
    (lambda: (_dec([1, 2]), True), 'total_tokens must be an integer, got True'),
    (lambda: (_dec(np.array([1.0, 2.0])), 4), 'request_pool_indices must hold integers, got dtype float64'),
    (lambda: (_dec({1, 2}), 4), 'request_pool_indices must be a list, tuple, numpy array or CPU tensor'),
    (lambda: (ForwardOp([0, 1], [1, 2], np.array([2.0, 2.0])), 4), 'input_lengths must hold integers'),
    (lambda: (_dec([1, 2], decode_input_ids=np.array([[1, 2]])), 4), 'decode_input_ids must be 1-D'),
    (lambda: (_mixed(input_ids=np.array([5.0, 6.0, 7.0])), 5), 'input_ids must hold integers, got dtype float64'),
    (lambda: (_mixed(input_ids=[5, 6.5, 7]), 5), 'input_ids must hold int32 integers'),
    (lambda: (_mixed(input_lengths=[2.5, 2], input_ids=[5, 6], shifted_input_ids=[6, 7]), 4.5),
     'total_tokens must be an integer, got 4.5'),
    (lambda: (_mixed(input_lengths=[2.5, 2.0]), 5), 'input_lengths must hold integers, got input_lengths[:1] = [2.5]'),
    (lambda: (ForwardOp(3, [1], [2]), 2), 'request_ids must be a sequence, got int'),
    (lambda: (_mixed(input_ids=[5, 2**33, 7]), 5), 'input_ids must hold int32 integers'),
    (lambda: (_mixed(prefill_lengths=[2]), 5), 'extend_prefix_lens[0] + input_lengths[0] = 0 + 3 goes past prefill_lengths[0] = 2'),
    (lambda: (_mixed(decode_input_ids=[2**31]), 5), 'decode_input_ids must hold int32 integers'),
    (lambda: (_mixed(request_pool_indices=[3, 2.0]), 5), 'request_pool_indices must hold int32 integers'),
    (lambda: (_mixed(extend_prefix_lens=[None]), 5), 'extend_prefix_lens must hold integers, got [None]'),
    (lambda: (_mixed(prefill_lengths=[3.0]), 5), 'prefill_lengths must hold integers, got [3.0]'),
]


@pytest.mark.parametrize('make, msg', _BAD)
def test_bad_input_touches_nothing(make, msg):
    rs, table = make_states(7, 9, 2, 1000)
    ib = InputBuffers(4, 16, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV)
    ib.fill_input_buffers(_dec([1, 4], decode_input_ids=[7, -1]), rs, table, 4)
    synchronize(DEV)
    bufs, state = ib.snapshot(), [t.clone() for t in state_of(rs)]
    op, total = make()
    with pytest.raises(ValueError) as e:
        ib.fill_input_buffers(op, rs, table, total)
    assert msg in str(e.value)
    synchronize(DEV)
    for k, v in ib.buffers().items():
        assert torch.equal(v, bufs[k]), k
    for a, b in zip(state_of(rs), state):
        assert torch.equal(a, b)


@pytest.mark.parametrize('kw', [
    dict(mamba_pool_indices=[1, 2], mamba_cow_src_indices=[1], mamba_branching_seqlens=[1, 2],
         mamba_track_pool_indices=[1, 2]),
    dict(mamba_cow_src_indices=[1, 2]),                        # one list given, three missing: not silently dropped
    dict(mamba_pool_indices=[], mamba_cow_src_indices=[], mamba_branching_seqlens=[], mamba_track_pool_indices=[]),
])
def test_mamba_lists_checked(kw):
    rs, table = make_states(8, 9, 1, 100)
    ib = InputBuffers(4, 8, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV, has_mamba=True)
    with pytest.raises(ValueError, match='four Mamba index lists'):
        ib.fill_input_buffers(ForwardOp([0, 1], [1, 2], [1, 1], **kw), rs, table, 2)


def test_empty_mamba_lists_without_mamba_buffers_carry_nothing():
    rs, table = make_states(8, 9, 1, 100)
    ib = InputBuffers(4, 8, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV)
    ib.fill_input_buffers(ForwardOp([0], [1], [1], mamba_pool_indices=[]), rs, table, 1)


def test_debug_mode_names_the_request():
    rs, table = make_states(9, 9, 2, 100)
    ib = InputBuffers(4, 16, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV)
    rs.valid_cache_lengths[4] = -1
    ops = [(_dec([1, 4]), 4), (_mixed(request_pool_indices=[4, 2]), 5)]
    for op, total in ops:
        ib.fill_input_buffers(op, rs, table, total)      # off: memory-safe and silent
    with device_value_checks():
        for op, total in ops:
            with pytest.raises(ValueError) as e:
                ib.fill_input_buffers(op, rs, table, total)
            assert 'valid_cache_lengths[4] = -1, must be >= 0' in str(e.value)
        ib.fill_input_buffers(_dec([1, 2]), rs, table, 4)   # good values pass


@pytest.mark.parametrize('call, msg', [
    (lambda: InputBuffers(4, 16, 0, 0, 8), 'page_size must be a positive integer'),
    (lambda: InputBuffers(0, 16, 4, 0, 8), 'max_bs must be a positive integer'),
    (lambda: InputBuffers(8, 4, 4, 0, 8), 'max_num_tokens (4) must be >= max_bs (8)'),
    (lambda: RuntimeStates(0, 100), 'req_pool_size must be a positive integer'),
    (lambda: RuntimeStates(4, 1), 'vocab_size must be an integer >= 2'),
    (lambda: RuntimeStates(4, 100, 0), 'output_length must be a positive integer'),
    (lambda: InputBuffers(4, 16, 4, 0, 8).fill_dummy_decode_buffers(5, 1), 'batch_size must be an integer in [0, 4]'),
    (lambda: InputBuffers(4, 16, 4, 0, 8).fill_dummy_decode_buffers(2.0, 1), 'batch_size must be an integer, got 2.0'),
    (lambda: InputBuffers(4, 16, 4.0, 0, 8), 'page_size must be a positive integer, got 4.0'),
    (lambda: RuntimeStates(4, 100.0), 'vocab_size must be an integer, got 100.0'),
])
def test_bad_construction(call, msg):
    with pytest.raises(ValueError) as e:
        call()
    assert msg in str(e.value)


# ---- padding rules -------------------------------------------------------------------------------------------------

@given(st.lists(st.integers(1, 300), min_size=1, max_size=8), st.integers(0, 320))
def test_pick_capture_size(sizes, batch):
    got = pick_capture_size(batch, sizes)
    fits = [s for s in sizes if s >= batch]
    assert got == (min(fits) if fits else None)


@given(max_bs=st.integers(1, 9), extra=st.integers(0, 9), has_mamba=st.booleans(), data=st.data())
def test_reset_tail_rule(max_bs, extra, has_mamba, data):
    pb = PaddedBuffers(max_bs, max_bs + extra, dummy_kv_slot=5, state_write_padding_pool_index=99, device=DEV,
                       has_mamba=has_mamba, scratch=data.draw(st.integers(0, 70)))
    for t in pb.buffers().values():
        t.fill_(3 if t.dtype != torch.bool else True)
    b = data.draw(st.integers(0, max_bs))
    t_ = data.draw(st.integers(0, max_bs + extra))
    ne = data.draw(st.integers(0, b))
    pb.reset_tail_(b, t_, ne)
    vals = padding_values(5, 99, has_mamba)
    for r in pb.rules:
        buf, start = getattr(pb, r.name), dict(tokens=t_, rows=b, extends=ne)[r.tail]
        assert (buf[..., :start] == (3 if r.dtype != torch.bool else True)).all(), r.name
        assert (buf[..., start:] == vals[r.name]).all(), r.name
    # the dict form on copies agrees with the method
    assert all(torch.equal(a, pb.buffers()[k]) for k, a in reset_tail(pb.snapshot(), vals, b, t_, ne).items())


def test_padded_buffers_layout():
    pb = PaddedBuffers(5, 11, 0, 0, device=DEV, has_mamba=True, scratch=13)
    ends = []
    for name, t in pb.buffers().items():
        off = t.data_ptr() - pb.slab.data_ptr()
        assert off % 256 == 0 and off == pb.offsets[name] * t.element_size()
        assert off >= 13 * 4
        ends.append((off, off + t.numel() * t.element_size()))
    ends.sort()
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:])), 'views overlap'


def test_clamp_and_dummy_rules():
    ids = torch.tensor([-5, 0, 7, 8, 100])
    assert clamp_token_ids_(ids, 8).tolist() == [0, 0, 7, 7, 7]
    assert dummy_decode_seq_len(4, 12) == 3 and dummy_decode_seq_len(4, 0) == 1 and dummy_decode_seq_len(0, 5) == 1
    with pytest.raises(ValueError, match='capture_sizes'):
        pick_capture_size(1, [0, 4])


@KERNEL_50
@given(fill_cases())
def test_fill_batch_order_equals_pool_order(case):
    "fill_input_buffers with a persistent batch-ordered table, rewritten before each step, equals the pool-ordered fill."
    max_bs, max_tok, W, has_mamba, pool_rows, vocab, ops, page_size, bad_cache, seed = case
    mk = lambda: InputBuffers(max_bs, max_tok, page_size, dummy_kv_slot=2, state_write_padding_pool_index=pool_rows - 1,
                              device=DEV, has_mamba=has_mamba)
    a, b = mk(), mk()
    rs_a, table = make_states(seed, pool_rows, W, vocab, page_size=page_size, bad_cache=bad_cache)
    rs_b, _ = make_states(seed, pool_rows, W, vocab, page_size=page_size, bad_cache=bad_cache)
    bt = torch.full((max_bs, table.shape[1]), 999, dtype=torch.int32, device=DEV)    # the scheduler's batch table
    for op_in, op, total in ops:
        pools = list(op.request_pool_indices)
        if pools: bt[:len(pools)] = table[torch.tensor(pools, device=DEV)]
        a.fill_input_buffers(op, rs_a, table, total)
        b.fill_input_buffers(op, rs_b, bt, total, table_order='batch')
        synchronize(DEV)
        for k, v in a.buffers().items():
            assert torch.equal(v, b.buffers()[k]), k
        for x, y in zip(state_of(rs_a), state_of(rs_b)):
            assert torch.equal(x, y)


@contextmanager
def planned(usual: bool):
    "Count the steps the named checks plan (`StepPlanner.plan_named`); `usual=False`: every step planned by them (`plan` made to call `plan_named`, as for a step it does not take at once). Yields the list of calls."
    calls, named = [], StepPlanner.plan_named
    def counted(self, *a, **kw):
        calls.append(a)
        return named(self, *a, **kw)
    with mock.patch.object(StepPlanner, 'plan_named', counted):
        if usual: yield calls
        else:
            with mock.patch.object(StepPlanner, 'plan', lambda self, op, total, captured=False:
                                   self.plan_named(op, total, captured)):
                yield calls


def _fills(got, ib, rs):
    "What a fill left: its return, the buffers, the runtime state (on the host)."
    synchronize(DEV)
    return got, {k: v.cpu() for k, v in ib.snapshot().items()}, [t.cpu() for t in state_of(rs)]


def _same_fills(a, b):
    assert a[0] == b[0]
    for k, v in a[1].items(): assert torch.equal(v, b[1][k]), k
    for x, y in zip(a[2], b[2]): assert torch.equal(x, y)


@KERNEL
@given(st.sampled_from([1, 4, 9]), st.integers(1, 3), st.booleans(), st.integers(0, 2**31 - 1), st.data())
def test_the_usual_step_fills_what_the_named_checks_fill(max_bs, W, has_mamba, seed, data):
    "A step from lists through the usual test (`StepPlanner.plan`: one test, one pack) fills what the same step through the named checks fills: buffers, state, overrides returned, `all_extends_mid_chunk`; and only an empty step leaves the usual test."
    # (token ids as lists here; as int32 arrays in test_token_ids_as_int32_arrays_take_the_usual_path)
    max_tok, pool_rows, vocab = 4 * max_bs, max_bs + 3, 40
    ops = data.draw(st.lists(forward_ops(max_bs, max_tok, W, pool_rows, vocab, has_mamba), min_size=1, max_size=3))
    out = []
    for usual in (True, False):
        rs, table = make_states(seed, pool_rows, W, vocab)
        ib = InputBuffers(max_bs, max_tok, 4, dummy_kv_slot=2, state_write_padding_pool_index=pool_rows - 1, device=DEV,
                          has_mamba=has_mamba)
        got = []
        with planned(usual) as calls:
            for _, op, total in ops:
                ib.poison_(POISON)
                r = ib.fill_input_buffers(op, rs, table, total)
                got.append(_fills((r, ib.all_extends_mid_chunk), ib, rs))
        assert len(calls) == (sum(len(op.request_ids) == 0 for _, op, _ in ops) if usual else len(ops))
        out.append(got)
    for a, b in zip(*out): _same_fills(a, b)


def test_debug_mode_fills_a_mixed_step_as_the_fast_path_does():
    "The debug mode's checked launch of the prefill rows writes what the unchecked one writes."
    snaps = []
    for debug in (False, True):
        rs, table = make_states(10, 9, 2, 100)
        rs.valid_cache_lengths[3] = 0          # the prefill row's cached length is its prefix (debug mode checks it)
        ib = InputBuffers(4, 16, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV).poison_()
        if debug:
            with device_value_checks(): ib.fill_input_buffers(_mixed(), rs, table, 5)
        else: ib.fill_input_buffers(_mixed(), rs, table, 5)
        synchronize(DEV)
        snaps.append({k: v.cpu() for k, v in ib.snapshot().items()})
    for k, v in snaps[0].items(): assert torch.equal(v, snaps[1][k]), k


def _decode_lists(B, with_overrides, data):
    "A decode step's pool rows (distinct, of 1..8) and overrides (-1 or a token id, out of the vocabulary too), or None."
    pools = data.draw(st.permutations(list(range(1, 9))))[:B]
    return pools, (data.draw(st.lists(st.just(-1) | st.integers(-3, 110), min_size=B, max_size=B)) if with_overrides
                   else None)


def _bound_buffers(seed, W):
    "Runtime states of 9 pool rows, a table, and poisoned buffers (max_bs 6) bound to them by an empty decode step."
    rs, table = make_states(seed, 9, W, 100)
    ib = InputBuffers(6, 24, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV).poison_(POISON)
    ib.fill_input_buffers(ForwardOp([], [], []), rs, table, 0)
    return rs, table, ib


@KERNEL
@given(st.integers(0, 6), st.integers(1, 3), st.booleans(), st.integers(0, 2**31 - 1), st.data())
def test_a_staged_decode_step_fills_what_the_list_step_fills(B, W, with_overrides, seed, data):
    "A decode step written straight into staging (`decode_slot` + `fill_staged_decode`) equals the same from lists."
    pools, ovr = _decode_lists(B, with_overrides, data)
    out = []
    for staged in (False, True):
        rs, table, ib = _bound_buffers(seed, W)
        if staged:
            sl = ib.decode_slot()
            if data.draw(st.booleans()): sl.put(pools, ovr)      # one struct pack (both lists: one, the gap zeroed)
            else:
                sl.req_pool_indices[:B] = pools
                if ovr is not None: sl.decode_input_ids[:B] = ovr
            ib.fill_staged_decode(sl, B, rs, table, overrides=ovr is not None)
        else: ib.fill_input_buffers(ForwardOp(list(range(B)), pools, [W] * B, decode_input_ids=ovr), rs, table, B * W)
        synchronize(DEV)
        out.append(({k: v.cpu() for k, v in ib.snapshot().items()},
                    [t.cpu() for t in (rs.future_input_map, rs.remote_spec_candidate_ready)]))
    for k, v in out[0][0].items(): assert torch.equal(v, out[1][0][k]), k
    for a, b in zip(out[0][1], out[1][1]): assert torch.equal(a, b)


@pytest.mark.parametrize('B', [3, 129])          # both ways of finding an override: builtins, and numpy above 128 rows
@pytest.mark.parametrize('one_set', [False, True])
def test_a_staged_step_reports_its_overrides_on_both_paths(B, one_set):
    "fill_staged_decode says whether a staged row overrides its input id, and fills what the list step fills."
    ovr = [-1] * B
    if one_set: ovr[B // 2] = 17
    out = []
    for staged in (False, True):
        rs, table = make_states(5, B + 2, 1, 100)
        ib = InputBuffers(B + 1, B + 1, 4, dummy_kv_slot=0, state_write_padding_pool_index=B + 1, device=DEV).poison_(-7)
        ib.fill_input_buffers(ForwardOp([], [], []), rs, table, 0)
        if staged:
            sl = ib.decode_slot()
            sl.req_pool_indices[:B] = range(1, B + 1)
            sl.decode_input_ids[:B] = ovr
            got = ib.fill_staged_decode(sl, B, rs, table, overrides=True)
        else: got = ib.fill_input_buffers(ForwardOp(list(range(B)), list(range(1, B + 1)), [1] * B, decode_input_ids=ovr), rs, table, B)
        synchronize(DEV)
        out.append((bool(got), {k: v.cpu() for k, v in ib.snapshot().items()}))
    assert out[0][0] == out[1][0] == one_set
    for k, v in out[0][1].items(): assert torch.equal(v, out[1][1][k]), k


@KERNEL
@given(st.integers(0, 2**31 - 1), st.data())
def test_token_ids_as_int32_arrays_take_the_usual_path(seed, data):
    "Token ids as int32 arrays (an engine that keeps them in arrays) fill what lists fill, on the usual path; other dtypes the named way."
    max_bs, max_tok, W, pool_rows, vocab = 4, 16, 2, 7, 40
    _, op, total = data.draw(forward_ops(max_bs, max_tok, W, pool_rows, vocab, False))
    out = []
    for i, form in enumerate((list, lambda v: np.array(v, dtype=np.int32), lambda v: np.array(v, dtype=np.int64))):
        rs, table = make_states(seed, pool_rows, W, vocab)
        ib = InputBuffers(max_bs, max_tok, 4, dummy_kv_slot=2, state_write_padding_pool_index=pool_rows - 1,
                          device=DEV).poison_(POISON)
        arr_op = ForwardOp(**{**vars(op), 'input_ids': form(op.input_ids), 'shifted_input_ids': form(op.shifted_input_ids)})
        with planned(True) as calls:
            got = ib.fill_input_buffers(arr_op, rs, table, total)
        usual = len(op.request_ids) > 0 and (i < 2 or not op.extend_prefix_lens)   # int64 ids of prefill rows: the named way
        assert len(calls) == (not usual), calls
        out.append(_fills(got, ib, rs))
    for o in out[1:]: _same_fills(o, out[0])


def test_a_decode_step_from_lists_for_the_engine_graph():
    "captured=True stages a decode step from lists in the capture slot: the engine graph's replay (issue_captured) runs it."
    from tokenspeed_lit.core.graphs import capture
    out = []
    for captured in (False, True):
        rs, table = make_states(4, 9, 2, 100)
        ib = InputBuffers(4, 16, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV).poison_(POISON)
        ib.fill_input_buffers(ForwardOp([], [], []), rs, table, 0)           # bind (an empty decode step)
        graph = capture(ib.issue_captured, DEV)
        op = _dec([3, 1, 5], decode_input_ids=[-1, 9, -1])
        assert ib.fill_input_buffers(op, rs, table, 6, captured=captured) == [-1, 9, -1]
        if captured: graph.replay()
        synchronize(DEV)
        out.append(({k: v.cpu() for k, v in ib.snapshot().items()}, [t.cpu() for t in state_of(rs)]))
        if captured:
            with pytest.raises(ValueError, match='captured=True stages a decode step for the engine graph, but the '
                                                 'step has 1 prefill rows'):
                ib.fill_input_buffers(_mixed(), rs, table, 5, captured=True)
            graph.replay(); synchronize(DEV)                      # no new step: reported by the next staging
            with pytest.raises(RuntimeError, match='replayed the capture slot 1 time'):
                ib.fill_input_buffers(op, rs, table, 6, captured=True)
            ib.fill_input_buffers(_dec([2]), rs, table, 2, captured=True)
            with pytest.raises(ValueError, match='outside the pool'):     # restaging refused: the slot holds no step
                ib.fill_input_buffers(_dec([2, 60]), rs, table, 4, captured=True, replace=True)
            graph.replay(); synchronize(DEV)
            assert ib.req_pool_indices_buf.tolist()[:2] == [0, 0] and ib.input_lengths_buf.tolist()[:2] == [1, 1]
            with pytest.raises(RuntimeError, match='replayed the capture slot 1 time'):   # that replay ran no step
                ib.fill_input_buffers(_dec([2]), rs, table, 2, captured=True)
            ib.fill_input_buffers(_dec([2]), rs, table, 2, captured=True)
            ib.fill_input_buffers(_dec([2, 6]), rs, table, 4, captured=True, replace=True)   # never replayed: restaged
            graph.replay(); synchronize(DEV)
            assert ib.req_pool_indices_buf.tolist()[:3] == [2, 6, 0]
    for k, v in out[0][0].items(): assert torch.equal(v, out[1][0][k]), k
    for a, b in zip(out[0][1], out[1][1]): assert torch.equal(a, b)


@KERNEL
@given(st.integers(1, 6), st.integers(1, 3), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1), st.data())
def test_a_graph_decode_step_fills_what_the_named_checks_fill(B, W, with_overrides, replace, seed, data):
    "A decode step for the engine's graph through the usual test runs as the same step through the named checks, replayed by the graph."
    from tokenspeed_lit.core.graphs import capture
    pools, ovr = _decode_lists(B, with_overrides, data)
    out = []
    for usual in (True, False):
        rs, table, ib = _bound_buffers(seed, W)
        graph = capture(ib.issue_captured, DEV)
        op = ForwardOp(list(range(B)), pools, [W] * B, decode_input_ids=ovr)
        with planned(usual) as calls:
            if replace: ib.fill_input_buffers(ForwardOp([0], [8], [W]), rs, table, W, captured=True)   # never replayed
            got = ib.fill_input_buffers(op, rs, table, B * W, captured=True, replace=replace)
        graph.replay()
        assert len(calls) == (0 if usual else 1 + replace)
        out.append(_fills(got, ib, rs))
    _same_fills(*out)


# ---- the four kinds of staging gone wrong, through InputBuffers' public ways in ------------------------------------
from tokenspeed_lit.core.graphs import capture


def _engine():
    "Buffers bound to fresh states, the engine's decode graph captured around `issue_captured`, one decode step run through it."
    rs, table = make_states(11, 9, 2, 100)
    ib = InputBuffers(4, 16, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV)
    ib.fill_input_buffers(_dec([1, 4], decode_input_ids=[7, -1]), rs, table, 4)
    graph = capture(ib.issue_captured, DEV)
    return ib, rs, table, graph


def _replay_runs_no_step(ib, rs, graph):
    "Replay the engine graph on poisoned buffers: no state touched, padding everywhere, counted and reported once."
    synchronize(DEV)
    ib.poison_(POISON)
    state, idle = [t.clone() for t in state_of(rs)], ib.step.ring.idle_replays
    graph.replay(); synchronize(DEV)
    for a, b in zip(state_of(rs), state): assert torch.equal(a, b)
    for name, t in ib.buffers().items():
        if name != 'mrope_positions_buf': assert (t == ib.values[name]).all(), name
    assert ib.step.ring.idle_replays == idle + 1
    with pytest.raises(RuntimeError, match='with no new step staged'): ib.decode_slot(captured=True)


_NOTHING_STAGED = {    # what came before an engine-graph replay that finds nothing new staged
    'a ring step from lists': lambda ib, rs, t, g: ib.fill_input_buffers(_dec([2, 3], decode_input_ids=[5, -1]), rs, t, 4),
    'a mixed step': lambda ib, rs, t, g: ib.fill_input_buffers(_mixed(), rs, t, 5),
    'a ring dummy step': lambda ib, rs, t, g: ib.fill_dummy_decode_buffers(2, 4),
    'a staged ring step': lambda ib, rs, t, g: (lambda sl: (sl.put([2, 3], [5, -1]),
                                                             ib.fill_staged_decode(sl, 2, rs, t, overrides=True)))(ib.decode_slot()),
    'a replayed graph step': lambda ib, rs, t, g: (ib.fill_input_buffers(_dec([2, 3], decode_input_ids=[5, -1]), rs, t, 4,
                                                                         captured=True), g.replay()),
    'a replayed staged graph step': lambda ib, rs, t, g: (lambda sl: (sl.put([2]), ib.fill_staged_decode(sl, 1, rs, t),
                                                                       g.replay()))(ib.decode_slot(captured=True)),
    'a replayed graph dummy step': lambda ib, rs, t, g: (ib.fill_dummy_decode_buffers(2, 4, captured=True), g.replay()),
    'construction': None,
}


@pytest.mark.parametrize('before', list(_NOTHING_STAGED))
def test_a_replay_that_finds_nothing_staged_runs_no_step(before):
    "A replay of the engine graph with nothing staged for it since the last step it ran never re-runs a step (its overrides applied twice)."
    if before == 'construction':      # a graph captured around a step that never staged anything
        rs, table = make_states(11, 9, 2, 100)
        ib = InputBuffers(4, 16, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV)
        ib.step.bind(rs.valid_cache_lengths, rs.future_input_map, rs.remote_spec_candidate_ready, rs.vocab_size, table)
        graph = capture(ib.issue_captured, DEV)
    else:
        ib, rs, table, graph = _engine()
        _NOTHING_STAGED[before](ib, rs, table, graph)
    _replay_runs_no_step(ib, rs, graph)


_REFUSED_RESTAGES = [   # a restaging for the engine graph refused part way: (op, total_tokens, what the refusal names)
    (_dec([2, 3], decode_input_ids=[5, 2**31]), 4, 'decode_input_ids must hold int32 integers'),
    (_dec([2, 3], decode_input_ids=[5, 6.5]), 4, 'decode_input_ids must hold int32 integers'),
    (_dec([2, 3], decode_input_ids=[5]), 4, 'decode_input_ids has 1 entries for 2 decode rows'),
    (_dec([2, 60]), 4, 'request_pool_indices holds 60, outside the pool'),
    (_dec([2, -1]), 4, 'request_pool_indices holds -1'),
    (_dec([2, 2]), 4, 'request_pool_indices holds pool row 2 twice'),
    (_dec([2, 2**31]), 4, 'request_pool_indices must hold int32 integers'),
    (_dec([1, 2, 3, 4, 5]), 10, 'batch of 5 requests is larger than max_bs=4'),
    (_dec([2, 3]), 5, 'total_tokens=5 differs from sum(input_lengths)=4'),
    (_mixed(), 5, 'captured=True stages a decode step for the engine graph, but the step has 1 prefill rows'),
]


@pytest.mark.parametrize('replace', [False, True])
@pytest.mark.parametrize('op, total, msg', _REFUSED_RESTAGES)
def test_a_refused_restage_leaves_nothing_staged(op, total, msg, replace):
    "A step staged for the graph and never replayed, then a restaging refused part way: the next replay runs neither."
    ib, rs, table, graph = _engine()
    ib.fill_input_buffers(_dec([3, 5], decode_input_ids=[9, -1]), rs, table, 4, captured=True)   # never replayed
    with pytest.raises(ValueError, match=re.escape(msg)):
        ib.fill_input_buffers(op, rs, table, total, captured=True, replace=replace)
    _replay_runs_no_step(ib, rs, graph)


@pytest.mark.parametrize('put, msg', [
    (([2, 3], [5]), 'decode_input_ids has 1 entries for 2 rows'),
    (([2, 3], [5, 6, 7]), 'decode_input_ids has 3 entries for 2 rows'),
    (([2, 2**31],), 'req_pool_indices must hold int32 integers'),
    ((list(range(1, 6)),), 'req_pool_indices has 5 entries, the slot holds max_bs=4'),
])
def test_a_refused_put_into_the_capture_slot_leaves_nothing_staged(put, msg):
    ib, rs, table, graph = _engine()
    ib.fill_input_buffers(_dec([3, 5], decode_input_ids=[9, -1]), rs, table, 4, captured=True)   # never replayed
    sl = ib.decode_slot(captured=True, replace=True)
    with pytest.raises(ValueError, match=re.escape(msg)): sl.put(*put)
    _replay_runs_no_step(ib, rs, graph)


def _slot_of_another(ib, rs, table):
    other = InputBuffers(4, 16, 4, dummy_kv_slot=0, state_write_padding_pool_index=8, device=DEV)
    other.fill_input_buffers(_dec([1]), rs, table, 2)
    return other.decode_slot()

_BAD_SLOTS = [   # a staging slot that is not what it seems: (how, what the refusal names)
    ('another InputBuffers', lambda ib, rs, t: _slot_of_another(ib, rs, t), 'handed out by another InputBuffers'),
    ('the ring reused it for a list step', lambda ib, rs, t: (lambda sl: (ib.fill_input_buffers(_dec([2]), rs, t, 2), sl)[-1])(
        ib.decode_slot()), 'is stale'),
    ('the ring reused it for a mixed step', lambda ib, rs, t: (lambda sl: (ib.fill_input_buffers(_mixed(), rs, t, 5), sl)[-1])(
        ib.decode_slot()), 'is stale'),
    ('a dummy step since', lambda ib, rs, t: (lambda sl: (ib.fill_dummy_decode_buffers(1, 2), sl)[-1])(ib.decode_slot()),
     'is stale'),
    ('a later decode_slot', lambda ib, rs, t: (lambda sl: (ib.decode_slot(), sl)[-1])(ib.decode_slot()), 'is stale'),
    ('a graph step since', lambda ib, rs, t: (lambda sl: (ib.fill_input_buffers(_dec([2]), rs, t, 2, captured=True), sl)[-1])(
        ib.decode_slot(captured=True)), 'is stale'),
    ('issued already', lambda ib, rs, t: (lambda sl: (sl.put([2]), ib.fill_staged_decode(sl, 1, rs, t), sl)[-1])(
        ib.decode_slot()), 'is stale'),
    ('not a slot', lambda ib, rs, t: object(), 'must be the StagingSlot of the latest decode_slot()'),
]


@pytest.mark.parametrize('case, make, msg', _BAD_SLOTS, ids=[c[0] for c in _BAD_SLOTS])
def test_a_staging_slot_that_is_not_what_it_seems_is_refused(case, make, msg):
    "Refused by name before anything is issued: no buffer, no state changes."
    ib, rs, table, graph = _engine()
    sl = make(ib, rs, table)
    synchronize(DEV)
    bufs, state = ib.snapshot(), [t.clone() for t in state_of(rs)]
    with pytest.raises(ValueError, match=re.escape(msg)): ib.fill_staged_decode(sl, 1, rs, table)
    synchronize(DEV)
    for k, v in ib.buffers().items(): assert torch.equal(v, bufs[k]), k
    for a, b in zip(state_of(rs), state): assert torch.equal(a, b)


@pytest.mark.parametrize('attr', ['req_pool_indices', 'decode_input_ids', 'mamba'])
def test_a_rebound_staging_array_is_refused(attr):
    ib, rs, table, graph = _engine()
    sl = ib.decode_slot()
    with pytest.raises(AttributeError, match=f'StagingSlot.{attr} is a view of pinned staging'):
        setattr(sl, attr, np.array([3, 5], dtype=np.int32))


_BAD_SIZES = [   # public ways in asked to write past the declared buffers (max_bs=4, max_num_tokens=16, width 2)
    (lambda ib, rs, t: ib.fill_input_buffers(ForwardOp(list(range(40)), list(range(40)), [2] * 40), rs, t, 80),
     'batch of 40 requests is larger than max_bs=4'),
    (lambda ib, rs, t: ib.fill_input_buffers(_mixed(input_lengths=[40, 2], input_ids=[1] * 40, shifted_input_ids=[1] * 40,
                                                    prefill_lengths=[40]), rs, t, 42), 'total_tokens=42 must be'),
    (lambda ib, rs, t: ib.fill_input_buffers(_mixed(input_lengths=[15, 2], input_ids=[1] * 15, shifted_input_ids=[1] * 15,
                                                    prefill_lengths=[15]), rs, t, 17), 'total_tokens=17 must be'),
    (lambda ib, rs, t: ib.fill_dummy_decode_buffers(10**6, 1), 'batch_size must be an integer in [0, 4]'),
    (lambda ib, rs, t: ib.fill_dummy_decode_buffers(2, 10**6), 'total_tokens must be an integer in [0, 16]'),
    (lambda ib, rs, t: ib.fill_staged_decode(ib.decode_slot(), 40, rs, t), 'batch of 40 requests is larger than max_bs=4'),
    (lambda ib, rs, t: ib.fill_staged_decode(ib.decode_slot(), -1, rs, t), 'batch must be an integer >= 0'),
    (lambda ib, rs, t: ib.fill_staged_decode(ib.decode_slot(), 2.0, rs, t), 'batch must be an integer, got 2.0'),
]


@pytest.mark.parametrize('call, msg', _BAD_SIZES)
def test_no_public_way_in_writes_past_the_buffers(call, msg):
    "Refused by name, the whole slab (every buffer, the staging, the bytes no buffer owns) and the state untouched."
    ib, rs, table, graph = _engine()
    synchronize(DEV)
    slab, state = ib.slab.clone(), [t.clone() for t in state_of(rs)]
    with pytest.raises(ValueError, match=re.escape(msg)): call(ib, rs, table)
    synchronize(DEV)
    assert torch.equal(ib.slab, slab)
    for a, b in zip(state_of(rs), state): assert torch.equal(a, b)


def test_a_table_order_other_than_pool_or_batch_is_refused_when_bound_too():
    "`table_order` is named whether or not the buffers are bound already (a bound step does not read an unknown order as 'pool')."
    rs = RuntimeStates(16, 100, device=DEV)
    table = torch.zeros(17, 4, dtype=torch.int32, device=DEV)
    ib = InputBuffers(8, 32, 4, 0, 16, DEV)
    op = ForwardOp([0], [3], [1])
    ib.fill_input_buffers(op, rs, table, 1)
    for order in (1, 'Pool', None):
        with pytest.raises(ValueError, match=re.escape(f"table_order must be 'pool' or 'batch', got {order!r}")):
            ib.fill_input_buffers(op, rs, table, 1, table_order=order)
