"""Property tests: the Triton kernels of `tokenspeed_lit.staging.positions` equal their plain-torch references exactly, on
random batches including empty ones, overflow past the page table, null pages and bad pool rows, and on bad device
values too (negative and huge lengths, `total_tokens` above and below the lengths' sum, negative cache starts, pool
rows outside the table, non-power-of-two page sizes). Every output sits inside a larger poisoned buffer: the guard
bands on both sides must stay untouched. Bad host input (narrow dtypes, floats, bad shapes) is refused naming the
argument, and the debug mode refuses bad device values naming the request."""
import time
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tokenspeed_lit.core.device import default_device
from tokenspeed_lit.core.contract import device_value_checks
from tokenspeed_lit.staging.positions import (compute_positions, compute_positions_ref, compute_out_cache_loc,
                                              compute_out_cache_loc_ref, compute_out_cache_loc_uniform,
                                              compute_out_cache_loc_sliding, kv_slot_ref, compute_positions_and_slots,
                                              launch_positions_and_slots_counted)

from conftest import DEV, POISON, GUARD, guarded, assert_guards, kernel_examples
KERNEL = settings(max_examples=kernel_examples(150))   # kernel properties: 150 examples on a GPU (conftest's profiles)
KERNEL_50 = settings(max_examples=kernel_examples(50))  # kernel properties at a GPU's default count, CI's under `ci`
MAX_TOTAL = 700                      # tokens per call: the interpreter runs ~1 ms per program




LENGTH = st.integers(0, 48)
BAD_LENGTH = st.integers(-2**31, -1) | st.sampled_from([-1, 10**6, 2**31 - 1, 2**40])


@st.composite
def ragged_batches(draw, max_batch=150, length=LENGTH, bad=True):
    "(prefix, lens, dtype) with lengths that are sometimes negative or huge (dtype int32 clips them to int32)."
    batch = draw(st.sampled_from([0, 1]) | st.integers(0, max_batch))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    lens = draw(st.lists(length | BAD_LENGTH if bad and draw(st.booleans()) else length, min_size=batch,
                         max_size=batch))
    prefix = draw(st.lists(st.integers(0, 5000), min_size=batch, max_size=batch))
    lim = torch.iinfo(dtype)
    lens = [min(max(x, lim.min), lim.max) for x in lens]
    return torch.tensor(prefix, dtype=dtype), torch.tensor(lens, dtype=dtype)


@st.composite
def totals(draw, lens):
    "`total_tokens` equal to, below or above the sum of the clamped lengths (never more than MAX_TOTAL)."
    covered = int(lens.long().clamp(0, MAX_TOTAL).sum().clamp(max=MAX_TOTAL))
    how = draw(st.sampled_from(['sum', 'below', 'above']))
    if how == 'below': return draw(st.integers(0, covered))
    if how == 'above': return min(covered + draw(st.integers(1, 40)), MAX_TOTAL)
    return covered


@st.composite
def page_tables(draw, max_rows=12, max_cols=8):
    rows, cols = draw(st.integers(1, max_rows)), draw(st.integers(1, max_cols))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(1, 1000, (rows, cols), generator=g, dtype=torch.int32)
    null = torch.rand(rows, cols, generator=g) < draw(st.sampled_from([0.0, 0.2, 0.5]))
    table[null] = torch.randint(-2, 1, (int(null.sum()),), generator=g, dtype=torch.int32)   # 0 or negative
    return table


PAGE_SIZES = st.sampled_from([1, 2, 3, 4, 5, 16])


@KERNEL
@given(ragged_batches(), st.data())
def test_positions_match_reference(batch, data):
    prefix, lens = batch
    total = data.draw(totals(lens))
    buf, out = guarded(total, torch.int64)
    own = data.draw(st.booleans())                 # the caller's extend_start_loc, or one the call allocates
    sbuf, starts = guarded(len(lens), torch.int32) if own else (None, None)
    pos, start = compute_positions(prefix.to(DEV), lens.to(DEV), total, out=out, extend_start_loc=starts)
    ref_pos, ref_start = compute_positions_ref(prefix, lens, total)
    assert torch.equal(pos.cpu(), ref_pos)
    assert torch.equal(start.cpu(), ref_start)
    assert_guards(buf)
    if own: assert_guards(sbuf); assert start.data_ptr() == starts.data_ptr()


@given(ragged_batches(max_batch=30, bad=False))
def test_positions_without_total_equal_reference(batch):
    prefix, lens = batch
    total = int(lens.sum())
    pos, start = compute_positions(prefix.to(DEV), lens.to(DEV), total)          # allocates its output
    ref_pos, ref_start = compute_positions_ref(prefix, lens)
    assert torch.equal(pos.cpu(), ref_pos) and torch.equal(start.cpu(), ref_start)
    assert pos.dtype == torch.int64 and start.dtype == torch.int32


def test_positions_work_is_bounded_by_total_tokens():
    t0 = time.perf_counter()
    pos, start = compute_positions(torch.tensor([7, 0], device=DEV), torch.tensor([10**9, 2**31 - 1], device=DEV), 4)
    assert time.perf_counter() - t0 < 5, 'the token loop followed the lengths, not total_tokens'
    assert pos.tolist() == [7, 8, 9, 10] and start.tolist() == [0, 4]


@KERNEL
@given(ragged_batches(max_batch=80, length=st.integers(0, 20)), page_tables(), PAGE_SIZES, st.integers(0, 3),
       st.data())
def test_out_cache_loc_match_reference(batch, table, page_size, dummy, data):
    _, lens = batch
    b = len(lens)
    rows, cols = table.shape
    total = data.draw(totals(lens))
    # pool rows mostly valid, sometimes out of range; cache starts sometimes negative or past the table
    pool = torch.tensor(data.draw(st.lists(st.integers(-1, rows), min_size=b, max_size=b)), dtype=torch.int64)
    start = torch.tensor(data.draw(st.lists(st.integers(-3, cols * page_size + 4), min_size=b, max_size=b)),
                         dtype=torch.int32)
    dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))
    buf, out = guarded(total, dtype)
    compute_out_cache_loc(out, pool.to(DEV), lens.to(DEV), start.to(DEV), table.to(DEV), page_size, dummy)
    ref = compute_out_cache_loc_ref(pool, lens, start, table, page_size, dummy, total_tokens=total)
    assert torch.equal(out.cpu().long(), ref)
    assert_guards(buf)
    # every slot is the dummy or inside a page the row really owns
    owner = torch.repeat_interleave(torch.arange(b), lens.long().clamp(0, MAX_TOTAL))[:total]
    for slot, row in zip(out.cpu().tolist(), owner.tolist()):
        if slot != dummy:
            assert slot // page_size in table[pool[row]].tolist()


def _slot_cases(max_batch: int) -> tuple:
    "The strategies of a ragged slots property: (prefix, lens), a page table, a page size, a dummy slot, data."
    return ragged_batches(max_batch=max_batch, length=st.integers(0, 20)), page_tables(), PAGE_SIZES, st.integers(0, 3), st.data()


def _pools_and_starts(data, n, rows, cols, page_size):
    "`n` pool rows (one past the table and -1 included) and cache starts (negative and past the table included)."
    pool = torch.tensor(data.draw(st.lists(st.integers(-1, rows), min_size=n, max_size=n)), dtype=torch.int64)
    start = torch.tensor(data.draw(st.lists(st.integers(-3, cols * page_size + 4), min_size=n, max_size=n)),
                         dtype=torch.int32)
    return pool, start


@given(*_slot_cases(60))
def test_positions_and_slots_equal_the_two_calls(batch, table, page_size, dummy, data):
    "One launch writes what compute_positions and compute_out_cache_loc write, and nothing outside either output."
    prefix, lens = batch
    b, (rows, cols) = len(lens), table.shape
    total = data.draw(totals(lens))
    pool, start = _pools_and_starts(data, b, rows, cols, page_size)
    pbuf, pos = guarded(total, torch.int64)
    lbuf, loc = guarded(total, data.draw(st.sampled_from([torch.int32, torch.int64])))
    sbuf, st_ = guarded(b, torch.int32)
    p, l, s = compute_positions_and_slots(pos, loc, prefix.to(DEV), lens.to(DEV), start.to(DEV), pool.to(DEV),
                                          table.to(DEV), page_size, total, dummy, extend_start_loc=st_)
    ref_pos, ref_start = compute_positions_ref(prefix, lens, total_tokens=total)
    assert torch.equal(p.cpu(), ref_pos) and torch.equal(s.cpu(), ref_start)
    assert torch.equal(l.cpu().long(), compute_out_cache_loc_ref(pool, lens, start, table, page_size, dummy,
                                                                 total_tokens=total))
    for buf in (pbuf, lbuf, sbuf): assert_guards(buf)


@given(*_slot_cases(40))
def test_counted_launch_equals_the_launch_with_the_counts(batch, table, page_size, dummy, data):
    "Counts read on the device, clamped to the buffers, give what the launch with those counts gives; rows past them are ignored."
    prefix, lens = batch
    rows_max, (rows, cols) = len(lens), table.shape
    max_tokens = data.draw(st.integers(0, MAX_TOTAL))
    b = data.draw(st.integers(0, rows_max) | st.sampled_from([-5, rows_max + 3, 2**31 - 1]))   # device values: any
    t = data.draw(st.integers(0, max_tokens) | st.sampled_from([-1, max_tokens + 1, 2**31 - 1]))
    b_eff, t_eff = min(max(b, 0), rows_max), min(max(t, 0), max_tokens)
    pool, start = _pools_and_starts(data, rows_max, rows, cols, page_size)
    by_batch = data.draw(st.booleans()) and rows >= rows_max
    got = [guarded(max_tokens, torch.int64), guarded(max_tokens, torch.int32), guarded(rows_max, torch.int32)]
    want = [guarded(max_tokens, torch.int64), guarded(max_tokens, torch.int32), guarded(rows_max, torch.int32)]
    counts = torch.tensor([b if b < 2**31 else 2**31 - 1, t], dtype=torch.int32, device=DEV)
    d = lambda x: x.to(DEV)
    launch_positions_and_slots_counted(counts, got[0][1], got[1][1], got[2][1], d(prefix), d(lens), d(start), d(pool),
                                       d(table), page_size, rows_max, max_tokens, dummy, by_batch)
    compute_positions_and_slots(want[0][1], want[1][1], d(prefix[:b_eff]), d(lens[:b_eff]), d(start[:b_eff]),
                                d(pool[:b_eff]), d(table), page_size, t_eff, dummy, extend_start_loc=want[2][1][:b_eff],
                                table_order='batch' if by_batch else 'pool')
    for (gbuf, _), (wbuf, _) in zip(got, want):
        assert torch.equal(gbuf.cpu(), wbuf.cpu())        # the same elements written, the rest still poison


@pytest.mark.parametrize('fn, sliding', [(compute_out_cache_loc_uniform, False), (compute_out_cache_loc_sliding, True)])
@KERNEL
@given(batch=st.sampled_from([0, 1]) | st.integers(0, 70), width=st.integers(0, 4), table=page_tables(),
       page_size=PAGE_SIZES, data=st.data())
def test_uniform_and_sliding_match_reference(fn, sliding, batch, width, table, page_size, data):
    rows, cols = table.shape
    pool = torch.tensor(data.draw(st.lists(st.integers(-2, rows + 1), min_size=batch, max_size=batch)),
                        dtype=torch.int64)
    start = torch.tensor(data.draw(st.lists(st.integers(-3, 3 * cols * page_size), min_size=batch, max_size=batch)),
                         dtype=torch.int64)
    buf, out = guarded(batch * width, data.draw(st.sampled_from([torch.int32, torch.int64])))
    if sliding and width > cols * page_size:     # the ring wraps inside one request's tokens: refused, nothing written
        with pytest.raises(ValueError, match=f'uniform_input_length={width} tokens of one request do not fit a ring'):
            fn(out, pool.to(DEV), width, start.to(DEV), table.to(DEV), page_size, dummy_slot=7)
        assert (buf.cpu() == POISON).all()
        return
    fn(out, pool.to(DEV), width, start.to(DEV), table.to(DEV), page_size, dummy_slot=7)
    pos = start[:, None] + torch.arange(width)[None, :]
    ref = kv_slot_ref(table, pool[:, None].expand(-1, width), pos, page_size, 7, sliding=sliding).flatten()
    assert torch.equal(out.cpu().long(), ref)
    assert_guards(buf)


def test_uniform_equals_ragged_with_equal_lengths():
    g = torch.Generator().manual_seed(3)
    table = torch.randint(-1, 300, (20, 9), generator=g, dtype=torch.int32)
    pool = torch.randint(0, 20, (50,), generator=g)
    start = torch.randint(0, 40, (50,), generator=g, dtype=torch.int32)
    for width in [1, 3]:
        a = torch.empty(50 * width, dtype=torch.int32, device=DEV)
        b = torch.empty_like(a)
        compute_out_cache_loc_uniform(a, pool.to(DEV), width, start.to(DEV), table.to(DEV), 4, 2)
        compute_out_cache_loc(b, pool.to(DEV), torch.full((50,), width, device=DEV), start.to(DEV), table.to(DEV), 4, 2)
        assert torch.equal(a, b)


def test_no_request_writes_only_padding():
    buf, out = guarded(5, torch.int64)
    pos, start = compute_positions(torch.zeros(0, dtype=torch.int32, device=DEV),
                                   torch.zeros(0, dtype=torch.int32, device=DEV), 5, out=out)
    assert pos.tolist() == [0] * 5 and start.numel() == 0
    assert_guards(buf)
    buf, out = guarded(4, torch.int32)
    z = torch.zeros(0, dtype=torch.int64, device=DEV)
    compute_out_cache_loc(out, z, z, z, torch.ones(2, 2, dtype=torch.int32, device=DEV), 4, dummy_slot=9)
    assert out.tolist() == [9] * 4
    assert_guards(buf)


def _i(*v):
    return torch.tensor(v, dtype=torch.int32, device=DEV)


def _t(*v):
    return _i(*v).view(1, -1)


@pytest.mark.parametrize('call, msg', [
    (lambda: compute_positions(_i(1), _i(1, 2), 3), 'lengths disagree'),
    (lambda: compute_positions(_i(1, 2), _i(1, 2), 3, extend_start_loc=torch.empty(1, dtype=torch.int32, device=DEV)),
     'extend_start_loc has 1 elements, 2 needed'),
    (lambda: compute_positions(_i(1), _i(1), 1, extend_start_loc=torch.empty(1, dtype=torch.int64, device=DEV)),
     'extend_start_loc must be int32'),
    (lambda: compute_positions(_i(1), _i(4), 4, out=torch.empty(3, dtype=torch.int64, device=DEV)), 'out has 3'),
    (lambda: compute_positions(_i(1), torch.ones(1, device=DEV), 1), 'extend_seq_lens must have an integer dtype'),
    (lambda: compute_positions(_i(1).float(), _i(1), 1), 'extend_prefix_lens must have an integer dtype'),
    (lambda: compute_positions(_i(1), _i(1), 1.5), 'total_tokens must be an integer, got 1.5'),
    (lambda: compute_positions(_i(1), _i(1), True), 'total_tokens must be an integer, got True'),
    (lambda: compute_positions(_i(1), _i(1), -2), 'total_tokens must be an integer in [0, '),
    (lambda: compute_positions(_i(1), _i(1), 1, out=torch.empty(1, dtype=torch.int32, device=DEV)),
     'out must be int64, got torch.int32'),
    (lambda: compute_positions(_i(1), _i(1), 1, out=torch.empty(1, dtype=torch.int16, device=DEV)),
     'out must be int64, got torch.int16'),
    (lambda: compute_positions(_i(1), _i(1), 2, out=torch.empty(4, dtype=torch.int64, device=DEV)[::2]),
     'out must be contiguous'),
    (lambda: compute_positions(_i(1), _i(1), 1, out=torch.empty(1, 1, dtype=torch.int64, device=DEV)),
     'out must have 1 dimension'),
    (lambda: compute_positions(_i(1), [1], 1), 'extend_seq_lens must be a torch.Tensor, got list'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _t(1, 2), -4), 'page_size'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _t(1, 2), 2.0), 'page_size must be a positive integer'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0, 0), _t(1, 2), 4), 'lengths disagree'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _i(1, 2), 4), 'req_to_page must have 2'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _t(1, 2)[:, :0], 4), 'at least one'),
    (lambda: compute_out_cache_loc(_i(0, 0).float(), _i(1), _i(2), _i(0), _t(1, 2), 4), 'out_cache_loc'),
    (lambda: compute_out_cache_loc(_i(0, 0).to(torch.int16), _i(1), _i(2), _i(0), _t(1, 2), 4),
     'out_cache_loc must be int32 or int64, got torch.int16'),
    (lambda: compute_out_cache_loc(_i(0, 0).to(torch.uint8), _i(1), _i(2), _i(0), _t(1, 2), 4),
     'out_cache_loc must be int32 or int64, got torch.uint8'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _t(1, 2), 4, dummy_slot=2**31),
     'dummy_slot must be an integer in [-2147483648, 2147483647], got 2147483648'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _t(1, 2), 4, dummy_slot=0.5), 'dummy_slot'),
    (lambda: compute_out_cache_loc_uniform(_i(0), _i(1, 1), 1, _i(0, 0), _t(1, 2), 4), 'out_cache_loc has 1'),
    (lambda: compute_out_cache_loc_uniform(_i(0), _i(1), -1, _i(0), _t(1, 2), 4), 'uniform_input_length'),
    (lambda: compute_out_cache_loc_uniform(_i(0).to(torch.int8), _i(1), 1, _i(0), _t(1, 2), 4),
     'out_cache_loc must be int32 or int64, got torch.int8'),
    (lambda: compute_out_cache_loc_sliding(_i(0), _i(1), 1, _i(0), _t(1, 2), 0), 'page_size'),
    (lambda: compute_out_cache_loc_sliding(_i(0), _i(1), 1.0, _i(0), _t(1, 2), 4),
     'uniform_input_length must be an integer, got 1.0'),
])
def test_bad_input_names_the_argument(call, msg):
    with pytest.raises(ValueError) as e:
        call()
    assert msg in str(e.value)


@pytest.mark.parametrize('call, msg', [
    (lambda: compute_positions(_i(0, 0), _i(2, -1), 2), 'request 1: extend_seq_lens[1] = -1, must be >= 0'),
    (lambda: compute_positions(_i(-4, 0), _i(2, 1), 3), 'request 0: extend_prefix_lens[0] = -4, must be >= 0'),
    (lambda: compute_positions(_i(0, 0), _i(2, 3), 4), 'extend_seq_lens add up to 5 tokens, more than total_tokens=4'),
    (lambda: compute_out_cache_loc(_i(0, 0, 0), _i(1, 1), _i(2, 1), _i(0, 0), _t(1, 2, 3).expand(2, 3), 4),
     'requests 0 and 1 share pool row 1'),
    (lambda: compute_out_cache_loc(_i(0, 0, 0), _i(0, 2), _i(2, 1), _i(0, 0), _t(1, 2).expand(2, 2), 4),
     'request 1: req_pool_indices[1] = 2, must be in [0, 2)'),
    (lambda: compute_out_cache_loc(_i(0, 0, 0), _i(0, 1), _i(2, 1), _i(0, -8), _t(1, 2).expand(2, 2), 4),
     'request 1: cache_start[1] = -8, must be >= 0'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(0, 1), _i(2, 1), _i(0, 0), _t(1, 2).expand(2, 2), 4),
     'input_lengths add up to 3 tokens, more than out_cache_loc.numel()=2'),
    (lambda: compute_out_cache_loc_uniform(_i(0, 0), _i(1, 1), 1, _i(0, 0), _t(1, 2).expand(2, 2), 4),
     'requests 0 and 1 share pool row 1'),
    (lambda: compute_out_cache_loc_sliding(_i(0, 0), _i(1, 0), 1, _i(0, -1), _t(1, 2).expand(2, 2), 4),
     'request 1: cache_start[1] = -1'),
])
def test_debug_mode_names_the_request(call, msg):
    call()                                   # off: memory-safe, defined, silent
    with device_value_checks():
        with pytest.raises(ValueError) as e:
            call()
    assert msg in str(e.value)


def test_debug_mode_accepts_good_values():
    with device_value_checks():
        pos, _ = compute_positions(_i(5, 0), _i(2, 1), 3)
        assert pos.tolist() == [5, 6, 0]
        out = _i(0, 0, 0)
        compute_out_cache_loc(out, _i(1, 0), _i(2, 1), _i(0, 0), _t(1, 2).expand(2, 2), 4)
        compute_out_cache_loc_uniform(out[:2], _i(1, 0), 1, _i(0, 0), _t(1, 2).expand(2, 2), 4)


# --- issue 16: batch-ordered tables, several KV groups in one launch, one hole policy on every path ---------------

from tokenspeed_lit.core.device import HAS_ACCEL
from tokenspeed_lit.staging.positions import (compute_out_cache_loc_groups, compute_out_cache_loc_groups_ref,
                                              _groups_kernel)


def pool_table_from(batch_table, pool, data):
    "A pool-indexed table whose row pool[i] is batch row i, the other rows random (another request's pages)."
    rows = max(int(pool.max()) + 1 if len(pool) else 1, data.draw(st.integers(1, 12)))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    table = torch.randint(-1, 1000, (rows, batch_table.shape[1]), generator=g, dtype=batch_table.dtype)
    table[pool] = batch_table
    return table


def distinct_pool(data, b):
    return torch.tensor(data.draw(st.permutations(range(b + data.draw(st.integers(0, 4)))))[:b], dtype=torch.int64)


@given(ragged_batches(max_batch=30, length=st.integers(0, 12)), st.integers(1, 4), st.sampled_from(['pool', 'batch']),
       st.data())
def test_groups_equal_one_call_per_group(batch, G, order, data):
    "One launch writes what G single-group calls write (full tables and rings), inside guarded outputs."
    _, lens = batch
    b = len(lens)
    total = data.draw(totals(lens))
    pool = distinct_pool(data, b) if order == 'batch' else torch.tensor(
        data.draw(st.lists(st.integers(-1, 12), min_size=b, max_size=b)), dtype=torch.int64)
    tables, sizes, widths = [], [], []
    for _ in range(G):
        t = data.draw(page_tables())
        if order == 'batch':
            t = torch.cat([t, t.new_zeros(max(0, b - t.shape[0]), t.shape[1])])    # a row per request
        tables.append(t)
        sizes.append(data.draw(PAGE_SIZES))
        widths.append(data.draw(st.none() | st.integers(1, t.shape[1])))
    start = torch.tensor(data.draw(st.lists(st.integers(-3, 40), min_size=b, max_size=b)), dtype=torch.int32)
    dummy = data.draw(st.integers(0, 3))
    bufs = [guarded(total, data.draw(st.sampled_from([torch.int32, torch.int64]))) for _ in range(G)]
    compute_out_cache_loc_groups([o for _, o in bufs], pool.to(DEV), lens.to(DEV), start.to(DEV),
                                 [t.to(DEV) for t in tables], sizes, widths, dummy, table_order=order)
    refs = compute_out_cache_loc_groups_ref(pool, lens, start, tables, sizes, widths, dummy, total, order)
    for g, ((buf, out), ref, t, w) in enumerate(zip(bufs, refs, tables, widths)):
        assert torch.equal(out.cpu().long(), ref), f'group {g}'
        assert_guards(buf)
        if w is None:    # the single-group kernel itself
            one = torch.empty_like(out)
            compute_out_cache_loc(one, pool.to(DEV), lens.to(DEV), start.to(DEV), t.to(DEV), sizes[g], dummy,
                                  table_order=order)
            assert torch.equal(one, out), f'group {g}'


@given(st.integers(0, 30), st.integers(1, 4), st.data())
def test_groups_rings_equal_the_sliding_call(batch, L, data):
    table = data.draw(page_tables())
    w = data.draw(st.integers(1, table.shape[1]))
    pool = torch.tensor(data.draw(st.lists(st.integers(0, table.shape[0] - 1), min_size=batch, max_size=batch)),
                        dtype=torch.int64)
    start = torch.tensor(data.draw(st.lists(st.integers(0, 60), min_size=batch, max_size=batch)), dtype=torch.int64)
    a = torch.empty(batch * L, dtype=torch.int32, device=DEV)
    b = torch.empty_like(a)
    compute_out_cache_loc_groups([a], pool.to(DEV), torch.full((batch,), L, device=DEV), start.to(DEV),
                                 [table.to(DEV)], [5], [w], dummy_slot=2)
    compute_out_cache_loc_sliding(b, pool.to(DEV), L, start.to(DEV), table[:, :w].to(DEV), 5, dummy_slot=2)
    assert torch.equal(a, b)


@KERNEL_50
@given(ragged_batches(max_batch=24, length=st.integers(0, 10)), page_tables(), PAGE_SIZES, st.data())
def test_batch_order_equals_pool_order_on_every_path(batch, table, page_size, data):
    "Each function, batch-ordered, writes what it writes pool-ordered on the pool table holding the same rows."
    prefix, lens = batch
    b = len(lens)
    batch_table = torch.cat([table, table.new_zeros(max(0, b - table.shape[0]), table.shape[1])])[:max(b, 1)]
    pool = distinct_pool(data, b)
    pool_table = pool_table_from(batch_table[:b], pool, data)
    start = torch.tensor(data.draw(st.lists(st.integers(-2, 40), min_size=b, max_size=b)), dtype=torch.int32)
    total = data.draw(totals(lens))
    L = data.draw(st.integers(1, min(3, table.shape[1] * page_size)))   # a sliding ring holds a step's tokens
    P, S, T = pool.to(DEV), start.to(DEV), lens.to(DEV)

    def run(order, tbl):
        tbl = tbl.to(DEV)
        outs = [torch.full((total,), -1, dtype=torch.int32, device=DEV) for _ in range(3)]
        outs.append(torch.full((total,), -1, dtype=torch.int64, device=DEV))
        outs += [torch.full((b * L,), -1, dtype=torch.int32, device=DEV) for _ in range(2)]
        compute_out_cache_loc(outs[0], P, T, S, tbl, page_size, 3, table_order=order)
        compute_out_cache_loc_groups([outs[1]], P, T, S, [tbl], [page_size], dummy_slot=3, table_order=order)
        compute_positions_and_slots(outs[3], outs[2], prefix.to(DEV), T, S, P, tbl, page_size, total, 3,
                                    table_order=order)
        compute_out_cache_loc_uniform(outs[4], P, L, S, tbl, page_size, 3, table_order=order)
        compute_out_cache_loc_sliding(outs[5], P, L, S, tbl, page_size, 3, table_order=order)
        return outs

    for x, y in zip(run('batch', batch_table), run('pool', pool_table)):
        assert torch.equal(x, y)


HOLE_TABLE = [[0, 0, 0], [3, -1, 0], [5, 7, 0]]     # row 1: a hole (-1) at column 1; row 2: a null page (0) at column 2


def _paths():
    "(name, call) for every slot path: call(table, order) returns the slots of requests at pool rows 1 and 2."
    P, S = _i(1, 2), _i(0, 6)                     # 7 tokens each, page size 4; row 2 reaches column 3: past the width

    def ragged(t, o):
        return compute_out_cache_loc(_i(*[-1] * 14), P, _i(7, 7), S, t, 4, 9, table_order=o)

    def groups(t, o):
        return compute_out_cache_loc_groups([_i(*[-1] * 14)], P, _i(7, 7), S, [t], [4], dummy_slot=9, table_order=o)[0]

    def both(t, o):
        pos = torch.empty(14, dtype=torch.int64, device=DEV)
        return compute_positions_and_slots(pos, _i(*[-1] * 14), S, _i(7, 7), S, P, t, 4, 14, 9, table_order=o)[1]

    def uniform(t, o):
        return compute_out_cache_loc_uniform(_i(*[-1] * 14), P, 7, S, t, 4, 9, table_order=o)

    return [('ragged', ragged), ('groups', groups), ('positions_and_slots', both), ('uniform', uniform)]


@pytest.mark.parametrize('order', ['pool', 'batch'])
@pytest.mark.parametrize('name, call', _paths())
def test_hole_policy_on_every_path(name, call, order):
    "A page id <= 0 and a column past the table's width give the dummy slot (9), in both orders."
    table = torch.tensor(HOLE_TABLE, dtype=torch.int32)
    t = table if order == 'pool' else table[[1, 2]]
    # request 0 (row 1), positions 0..6: page 3 (slots 12..15), then the hole -1 (dummy);
    # request 1 (row 2), positions 6..12: page 7 (30, 31), the null page 0 (dummy), column 3 past the width (dummy)
    assert call(t.to(DEV), order).tolist() == [12, 13, 14, 15, 9, 9, 9] + [30, 31, 9, 9, 9, 9, 9], name


@pytest.mark.parametrize('call, msg', [
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _t(1, 2), 4, table_order='rows'),
     "table_order must be 'pool' or 'batch', got 'rows'"),
    (lambda: compute_out_cache_loc_uniform(_i(0, 0), _i(1, 0), 1, _i(0, 0), _t(1, 2), 4, table_order='batch'),
     "req_to_page has 1 rows, 2 needed (table_order='batch')"),
    (lambda: compute_out_cache_loc_groups([_i(0, 0)], _i(1), _i(2), _i(0), [_t(1, 2)], [4], [3]),
     'sliding_widths[0] must be an integer in [1, 2], got 3'),
    (lambda: compute_out_cache_loc_groups([_i(0, 0)], _i(1), _i(2), _i(0), [_t(1, 2)], 4),
     'page_sizes must be a list or tuple'),
    (lambda: compute_out_cache_loc_groups([_i(0, 0)] * 5, _i(1), _i(2), _i(0), [_t(1, 2)] * 5, [4] * 5),
     'req_to_pages must hold 1 to 4 tables, got 5'),
    (lambda: compute_out_cache_loc_groups([], _i(1), _i(2), _i(0), [], []), 'req_to_pages must hold 1 to 4 tables'),
    (lambda: compute_out_cache_loc_groups([_i(0, 0), _i(0, 0)], _i(1), _i(2), _i(0), [_t(1, 2), _t(1, 2)], [4, 4],
                                          dummy_slot=2**40), 'dummy_slot must be an integer in'),
    (lambda: compute_out_cache_loc_groups([_i(0, 0)], _i(1), _i(2), _i(0), [_t(1, 2)], [4], table_order='batch',
                                          dummy_slot=1.5), 'dummy_slot must be an integer'),
])
def test_bad_table_input_names_the_argument(call, msg):
    with pytest.raises(ValueError) as e:
        call()
    assert msg in str(e.value)


def test_groups_debug_mode_names_the_request():
    call = lambda: compute_out_cache_loc_groups([_i(0, 0)], _i(3), _i(2), _i(0), [_t(1, 2).expand(2, 2)], [4])
    call()
    with device_value_checks():
        with pytest.raises(ValueError, match=r'request 0: req_pool_indices\[0\] = 3, must be in \[0, 2\)'):
            call()
        compute_out_cache_loc_groups([_i(0, 0)], _i(3), _i(2), _i(0), [_t(1, 2)], [4], table_order='batch')


def compiled_variants(jit_fn) -> int:
    "Compiled specialisations of a Triton kernel, over every device."
    return sum(len(cache[0]) for cache in jit_fn.device_caches.values())


@pytest.mark.parametrize('order', ['pool', 'batch'])
def test_groups_after_a_launch_with_ones(order):
    "A launch compiled for per-group ints of 1 (Triton folds them in) is never reused for others: each call checked."
    g = torch.Generator().manual_seed(7)
    base = torch.randint(1, 500, (6, 8), generator=g, dtype=torch.int32)
    pool, lens, start = torch.tensor([4, 0, 2]), torch.tensor([2, 3, 1], dtype=torch.int32), torch.tensor([0, 5, 9])
    for size, cols in ((1, 1), (5, 8), (16, 3), (1, 8), (5, 1)):
        tables = [base[:, :cols].contiguous(), base[:, ::2].contiguous()]
        if order == 'batch': tables = [t[pool] for t in tables]
        outs = [torch.full((6,), -7, dtype=torch.int32, device=DEV) for _ in range(2)]
        compute_out_cache_loc_groups(outs, pool.to(DEV), lens.to(DEV), start.to(DEV), [t.to(DEV) for t in tables],
                                     [size, 4], dummy_slot=3, table_order=order)
        refs = compute_out_cache_loc_groups_ref(pool, lens, start, tables, [size, 4], None, 3, 6, order)
        for k, (o, r) in enumerate(zip(outs, refs)):
            assert torch.equal(o.cpu(), r.to(o.dtype)), f'page size {size}, {cols} columns, group {k}: {o.tolist()} != {r.tolist()}'


@pytest.mark.skipif(not HAS_ACCEL, reason='compiled kernels need a GPU')
@pytest.mark.parametrize('order', ['pool', 'batch'])
@pytest.mark.parametrize('out_dtype', [torch.int32, torch.int64])
def test_groups_compile_once_per_dtype_combination(order, out_dtype):
    "Widths 1..4096, batches 1..8192, tokens, page sizes and rings (sampled): one compiled variant per dtype and G."
    # (pointers are specialised on 16-byte alignment, as in every kernel: the outputs here are separate allocations)
    big = torch.randint(-1, 10**6, (8192, 4096), dtype=torch.int32, device=DEV)
    widths = [1, 2, 3, 15, 16, 17, 32, 100, 1024, 4095, 4096]
    batches = [1, 2, 7, 16, 17, 256, 1000, 4096, 8191, 8192]
    # Triton specialises the elements of a tuple parameter whatever do_not_specialize says (see `launch`): an int
    # element of 1 is compiled in, one divisible by 16 is marked so. Each call's classes of its per-group ints bound
    # the variants; where a Triton honours do_not_specialize inside tuples, one variant is all it may compile.
    cls = lambda v: 'one' if v == 1 else 'x16' if v % 16 == 0 else 'n'
    before, seen = compiled_variants(_groups_kernel), set()
    for i, bs in enumerate(batches):
        for j, w in enumerate(widths[i % 3::3]):
            L = 1 + (i + j) % 4
            tables = [big[:, :w], big[:, :max(1, w // 2)]]
            outs = [torch.empty(bs * L, dtype=out_dtype, device=DEV) for _ in range(2)]   # aligned, as persistent buffers
            sizes, rings = [1 + (i * j) % 17, 16], [None, max(1, w // 3)]
            compute_out_cache_loc_groups(outs, torch.randperm(8192, device=DEV)[:bs], torch.full((bs,), L, device=DEV),
                                         torch.randint(0, 1000, (bs,), device=DEV), tables, sizes, rings,
                                         table_order=order)
            ints = [t.stride(0) for t in tables] + [t.stride(1) for t in tables] + [t.shape[0] for t in tables]
            ints += [r or t.shape[1] for t, r in zip(tables, rings)] + sizes
            seen.add(tuple(cls(v) for v in ints))
    torch.cuda.synchronize()
    assert compiled_variants(_groups_kernel) - before <= len(seen)
