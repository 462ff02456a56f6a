"""Property tests: the Triton kernels of `tokenspeed_lit.positions` equal their plain-torch references exactly,
on random batches including empty ones, overflow past the page table, null pages and bad pool rows, and never
write past the end of the active region (outputs are poisoned first)."""
import pytest
import torch
from hypothesis import given, strategies as st

from tokenspeed_lit.core import default_device
from tokenspeed_lit.positions import (compute_positions, compute_positions_ref, compute_out_cache_loc,
                                      compute_out_cache_loc_ref, compute_out_cache_loc_uniform,
                                      compute_out_cache_loc_sliding, kv_slot_ref)

DEV = default_device()
POISON = -12345


@st.composite
def ragged_batches(draw, max_batch=150, max_len=48):
    batch = draw(st.sampled_from([0, 1]) | st.integers(0, max_batch))
    lens = draw(st.lists(st.integers(0, max_len), min_size=batch, max_size=batch))
    prefix = draw(st.lists(st.integers(0, 5000), min_size=batch, max_size=batch))
    return torch.tensor(prefix, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)


@st.composite
def page_tables(draw, max_rows=12, max_cols=8):
    rows, cols = draw(st.integers(1, max_rows)), draw(st.integers(1, max_cols))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(1, 1000, (rows, cols), generator=g, dtype=torch.int32)
    null = torch.rand(rows, cols, generator=g) < draw(st.sampled_from([0.0, 0.2, 0.5]))
    table[null] = torch.randint(-2, 1, (int(null.sum()),), generator=g, dtype=torch.int32)   # 0 or negative
    return table


@given(ragged_batches(), st.integers(0, 9), st.sampled_from([torch.int32, torch.int64]))
def test_positions_match_reference(batch, slack, dtype):
    prefix, lens = batch
    total = int(lens.sum())
    out = torch.full((total + slack,), POISON, dtype=torch.int64, device=DEV)
    pos, start = compute_positions(prefix.to(dtype).to(DEV), lens.to(dtype).to(DEV), total, out=out)
    ref_pos, ref_start = compute_positions_ref(prefix, lens)
    assert torch.equal(pos.cpu(), ref_pos)
    assert torch.equal(start.cpu(), ref_start)
    assert (out[total:] == POISON).all(), 'wrote past total_tokens'


@given(ragged_batches(max_batch=40), st.data())
def test_positions_truncated_total_never_overruns(batch, data):
    prefix, lens = batch
    total = int(lens.sum())
    cut = data.draw(st.integers(0, total))
    out = torch.full((total + 3,), POISON, dtype=torch.int64, device=DEV)
    compute_positions(prefix.to(DEV), lens.to(DEV), cut, out=out)
    ref_pos, _ = compute_positions_ref(prefix, lens)
    assert torch.equal(out[:cut].cpu(), ref_pos[:cut])
    assert (out[cut:] == POISON).all()


@given(ragged_batches(max_batch=80, max_len=20), page_tables(), st.sampled_from([1, 2, 4, 16]),
       st.integers(0, 3), st.data())
def test_out_cache_loc_match_reference(batch, table, page_size, dummy, data):
    _, lens = batch
    b = len(lens)
    rows, cols = table.shape
    # pool rows mostly valid, sometimes out of range; cache starts that sometimes overflow the table
    pool = torch.tensor(data.draw(st.lists(st.integers(-1, rows), min_size=b, max_size=b)), dtype=torch.int64)
    start = torch.tensor(data.draw(st.lists(st.integers(0, cols * page_size + 4), min_size=b, max_size=b)),
                         dtype=torch.int32)
    total = int(lens.sum())
    out = torch.full((total + 5,), POISON, dtype=torch.int32, device=DEV)
    compute_out_cache_loc(out[:total], pool.to(DEV), lens.to(DEV), start.to(DEV), table.to(DEV), page_size, dummy)
    ref = compute_out_cache_loc_ref(pool, lens, start, table, page_size, dummy)
    assert torch.equal(out[:total].cpu().long(), ref)
    assert (out[total:] == POISON).all()
    # every slot is the dummy or inside a page the row really owns
    owner = torch.repeat_interleave(torch.arange(b), lens.long())
    for slot, row in zip(out[:total].cpu().tolist(), owner.tolist()):
        if slot != dummy:
            assert slot // page_size in table[pool[row]].tolist()


@pytest.mark.parametrize('fn, sliding', [(compute_out_cache_loc_uniform, False), (compute_out_cache_loc_sliding, True)])
@given(batch=st.sampled_from([0, 1]) | st.integers(0, 70), width=st.integers(0, 4), table=page_tables(),
       page_size=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_uniform_and_sliding_match_reference(fn, sliding, batch, width, table, page_size, data):
    rows, cols = table.shape
    pool = torch.tensor(data.draw(st.lists(st.integers(0, rows - 1), min_size=batch, max_size=batch)), dtype=torch.int64)
    start = torch.tensor(data.draw(st.lists(st.integers(0, 3 * cols * page_size), min_size=batch, max_size=batch)),
                         dtype=torch.int64)
    out = torch.full((batch * width + 4,), POISON, dtype=torch.int64, device=DEV)
    fn(out, pool.to(DEV), width, start.to(DEV), table.to(DEV), page_size, dummy_slot=7)
    pos = start[:, None] + torch.arange(width)[None, :]
    ref = kv_slot_ref(table, pool[:, None].expand(-1, width), pos, page_size, 7, sliding=sliding).flatten()
    assert torch.equal(out[:batch * width].cpu(), ref)
    assert (out[batch * width:] == POISON).all()


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


def _i(*v):
    return torch.tensor(v, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize('call, msg', [
    (lambda: compute_positions(_i(1), _i(1, 2), 3), 'lengths disagree'),
    (lambda: compute_positions(_i(1), _i(4), 4, out=torch.empty(3, dtype=torch.int64, device=DEV)), 'out has 3'),
    (lambda: compute_positions(_i(1), torch.ones(1, device=DEV), 1), 'extend_seq_lens must have an integer dtype'),
    (lambda: compute_positions(_i(1).float(), _i(1), 1), 'extend_prefix_lens must have an integer dtype'),
    (lambda: compute_positions(_i(1), _i(1), 1.5), 'total_tokens'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _i(1, 2).view(1, 2), -4), 'page_size'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0, 0), _i(1, 2).view(1, 2), 4), 'lengths disagree'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _i(1, 2), 4), 'req_to_page must have 2'),
    (lambda: compute_out_cache_loc(_i(0, 0), _i(1), _i(2), _i(0), _i(1, 2).view(1, 2)[:, :0], 4), 'at least one'),
    (lambda: compute_out_cache_loc(_i(0, 0).float(), _i(1), _i(2), _i(0), _i(1, 2).view(1, 2), 4), 'out_cache_loc'),
    (lambda: compute_out_cache_loc_uniform(_i(0), _i(1, 1), 1, _i(0, 0), _i(1, 2).view(1, 2), 4), 'out_cache_loc has 1'),
    (lambda: compute_out_cache_loc_uniform(_i(0), _i(1), -1, _i(0), _i(1, 2).view(1, 2), 4), 'uniform_input_length'),
    (lambda: compute_out_cache_loc_sliding(_i(0), _i(1), 1, _i(0), _i(1, 2).view(1, 2), 0), 'page_size'),
])
def test_bad_input_names_the_argument(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()
