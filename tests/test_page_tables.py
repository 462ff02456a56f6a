"""Property tests: `expand_page_table` and `DraftPageTable.publish` equal their plain-torch references exactly, on
tables with holes (page ids <= 0), outputs as wide as the expanded table and wider (columns past its width; a narrower
one is refused), padded rows,
non-power-of-two ratios, bad pool rows and batches of 0 and 1. Every output is a window of a larger poisoned buffer:
the guard bands around it must stay untouched. On the GPU, each kernel compiles at most once per dtype combination
across widths 1..4096 and batches 1..8192."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tokenspeed_lit.core.device import default_device, HAS_ACCEL
from tokenspeed_lit.staging.page_tables import expand_page_table, expand_page_table_ref, DraftPageTable, _expand_kernel

from conftest import DEV, POISON, guarded2d, assert_guards2d as assert_guards, kernel_examples
KERNEL = settings(max_examples=kernel_examples(100))   # kernel properties: 100 examples on a GPU (conftest's profiles)


@st.composite
def tables(draw, max_rows=9, max_cols=7):
    "Page tables with holes (0 and negative ids), int32 or int64, sometimes column-major."
    rows = draw(st.sampled_from([0, 1]) | st.integers(0, max_rows))
    cols = draw(st.integers(0, max_cols))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    t = torch.randint(1, 10_000, (rows, cols), generator=g, dtype=torch.int64)
    null = torch.rand(rows, cols, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.7]))
    t[null] = torch.randint(-3, 1, (int(null.sum()),), generator=g)
    t = t.to(draw(st.sampled_from([torch.int32, torch.int64])))
    return t.t().contiguous().t() if draw(st.booleans()) else t


RATIOS = st.sampled_from([1, 2, 3, 4, 5, 7, 16])


@KERNEL
@given(tables(), RATIOS, st.data())
def test_expand_matches_reference(table, ratio, data):
    rows, width = table.shape
    out_width = data.draw(st.sampled_from([0, 1, width * ratio, width * ratio + 5]) | st.integers(0, 3 * width * ratio + 3))
    buf, out = guarded2d(rows, out_width, data.draw(st.sampled_from([torch.int32, torch.int64])))
    if out_width < width * ratio:              # pages would be dropped: refused, nothing written
        with pytest.raises(ValueError, match=f'out has {out_width} columns, fewer than ratio x table width'):
            expand_page_table(table.to(DEV), out, ratio)
        assert (buf.cpu() == POISON).all()
        return
    got = expand_page_table(table.to(DEV), out, ratio)
    assert got is out
    assert torch.equal(out.cpu().long(), expand_page_table_ref(table, out_width, ratio))
    assert_guards(buf.cpu(), rows, out_width)


def test_expand_holes_and_tail_follow_the_rule():
    table = torch.tensor([[0, -1, 5]], dtype=torch.int32, device=DEV)
    out = torch.full((1, 11), 99, dtype=torch.int32, device=DEV)
    expand_page_table(table, out, 3)
    assert out.tolist() == [[0, 1, 2, 0, 1, 2, 15, 16, 17, 0, 0]]


@KERNEL
@given(tables(max_rows=6), st.sampled_from([1, 2, 3]), st.integers(0, 3), st.booleans(), st.data())
def test_publish_matches_reference(table, ratio, extra_rows, gather, data):
    "Rows [0, bs) are the batch's rows expanded, [bs, padded_bs) zero, rows past padded_bs untouched."
    num_rows, width = table.shape
    if gather:       # pool-ordered: batch row i reads table row pool[i] (sometimes outside the table: zeros)
        bs = data.draw(st.integers(0, 6))
        pool = torch.tensor(data.draw(st.lists(st.integers(-2, num_rows + 1), min_size=bs, max_size=bs)),
                            dtype=data.draw(st.sampled_from([torch.int32, torch.int64])))
        ok = (pool >= 0) & (pool < num_rows)
        src = torch.zeros(bs, width, dtype=torch.long)
        if num_rows: src[ok] = table.long()[pool[ok]]
    else:
        bs, pool, src = num_rows, None, table
    padded = bs + extra_rows
    dpt_width = width * ratio + data.draw(st.integers(0, 4))
    if dpt_width == 0: return
    dpt = DraftPageTable(max_bs=padded + 2, width=dpt_width, ratio=ratio, device=DEV,
                         dtype=data.draw(st.sampled_from([torch.int32, torch.int64])))
    dpt.table.fill_(POISON)
    got = dpt.publish(table.to(DEV), padded, None if pool is None else pool.to(DEV))
    assert got.shape == (padded, dpt_width) and (not padded or got.data_ptr() == dpt.table.data_ptr())
    want = torch.zeros(padded, dpt_width, dtype=torch.long)
    want[:bs] = expand_page_table_ref(src, dpt_width, ratio)
    assert torch.equal(got.cpu().long(), want)
    assert (dpt.table[padded:] == POISON).all(), 'wrote past padded_bs'


def test_publish_in_pool_order_equals_batch_order():
    g = torch.Generator().manual_seed(1)
    batch_table = torch.randint(-1, 50, (5, 3), generator=g, dtype=torch.int32)
    pool = torch.tensor([7, 2, 0, 5, 3])
    pool_table = torch.randint(-1, 50, (8, 3), generator=g, dtype=torch.int32)
    pool_table[pool] = batch_table
    a, b = DraftPageTable(8, 8, ratio=2, device=DEV), DraftPageTable(8, 8, ratio=2, device=DEV)
    a.publish(batch_table.to(DEV), 7)
    b.publish(pool_table.to(DEV), 7, req_pool_indices=pool.to(DEV))
    assert torch.equal(a.table, b.table)


def _i(*v):
    return torch.tensor(v, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize('call, msg', [
    (lambda: expand_page_table(_i(1, 2).view(1, 2), torch.empty(2, 4, dtype=torch.int32, device=DEV), 2),
     'out has 2 rows, 1 needed'),
    (lambda: expand_page_table(_i(1, 2).view(1, 2), torch.empty(1, 4, dtype=torch.uint8, device=DEV), 2),
     'out must be int32 or int64, got torch.uint8'),
    (lambda: expand_page_table(_i(1, 2).view(1, 2), torch.empty(4, dtype=torch.int32, device=DEV), 2),
     'out must have 2 dimension(s)'),
    (lambda: expand_page_table(_i(1, 2).view(1, 2), [[0]], 2), 'out must be a torch.Tensor'),
    (lambda: expand_page_table(_i(1, 2).view(1, 2).float(), torch.empty(1, 4, dtype=torch.int32, device=DEV), 2),
     'table must have an integer dtype'),
    (lambda: expand_page_table(_i(1, 2).view(1, 2), torch.empty(1, 4, dtype=torch.int32, device=DEV), True),
     'ratio must be an integer, got True'),
    (lambda: expand_page_table(_i(1, 2).view(1, 2), torch.empty(1, 4, dtype=torch.int32, device=DEV), -1),
     'ratio must be an integer in [1, 1048576], got -1'),
    (lambda: DraftPageTable(2, 0), 'width must be an integer >= 1, got 0'),
    (lambda: DraftPageTable(2, 4, ratio=0), 'ratio must be an integer in [1, 1048576], got 0'),
    (lambda: DraftPageTable(2, 4).publish(_i(1), 1), 'table must have 2 dimension(s)'),
    (lambda: DraftPageTable(2, 4, device=DEV).publish(_i(1, 2).view(1, 2), 1, req_pool_indices=_i(0).float()),
     'req_pool_indices must have an integer dtype'),
    (lambda: DraftPageTable(2, 4, device=DEV).publish(_i(1, 2, 3).view(3, 1)), 'padded_bs must be an integer in [3, 2]'),
    (lambda: DraftPageTable(2, 4, ratio=3, device=DEV).publish(_i(1, 2).view(1, 2)), 'table has 2 columns: 6 expanded'),
    (lambda: DraftPageTable(2, 4, device=DEV).publish(_i(1, 2).view(1, 2), 1.0), 'padded_bs must be an integer'),
])
def test_bad_input_names_the_argument(call, msg):
    with pytest.raises(ValueError) as e:
        call()
    assert msg in str(e.value)


def compiled_variants(jit_fn) -> int:
    "Compiled specialisations of a Triton kernel, over every device."
    return sum(len(cache[0]) for cache in jit_fn.device_caches.values())


WIDTHS = [1, 2, 3, 15, 16, 17, 31, 32, 100, 128, 1000, 1024, 4095, 4096]
BATCHES = [1, 2, 7, 8, 16, 17, 255, 256, 1000, 4096, 8191, 8192]


@pytest.mark.skipif(not HAS_ACCEL, reason='compiled kernels need a GPU')
@pytest.mark.parametrize('table_dtype, out_dtype', [(torch.int32, torch.int32), (torch.int64, torch.int32),
                                                    (torch.int32, torch.int64)])
def test_expand_compiles_once_per_dtype_combination(table_dtype, out_dtype):
    "Widths 1..4096, batches 1..8192, ratios 1..7 (sampled): one compiled variant per dtype combination and mode."
    big = torch.randint(-1, 1000, (8192, 4096), dtype=table_dtype, device=DEV)
    before = compiled_variants(_expand_kernel)
    for i, (bs, w) in enumerate([(b, w) for b in BATCHES for w in WIDTHS][::3]):
        ratio = max(1, min(1 + i % 7, 8192 // w))               # out holds ratio x width columns (8192 at most)
        table = big[:bs, :w].contiguous()
        out = torch.empty(bs, min(w * ratio + i % 5, 8192), dtype=out_dtype, device=DEV)
        expand_page_table(table, out, ratio)
    torch.cuda.synchronize()
    assert compiled_variants(_expand_kernel) - before <= 1
    dpt = DraftPageTable(8192, 8192, dtype=out_dtype, device=DEV)
    before = compiled_variants(_expand_kernel)
    for bs in BATCHES:
        for w in WIDTHS[::4]:
            dpt.publish(big[:bs, :w], min(bs + 3, 8192), req_pool_indices=torch.arange(bs, device=DEV))
    torch.cuda.synchronize()
    assert compiled_variants(_expand_kernel) - before <= 1
