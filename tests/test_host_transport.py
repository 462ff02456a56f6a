"""Property tests of the GPU transports of `tokenspeed_lit.tiers.host_transport` (on a CPU they run through the Triton
interpreter): byte-for-byte equal to the per-slice reference transport on whole host blocks and whole pools, at every
alignment the page-copy kernel can be handed, with chunked staging and coalesced runs, and (GPU only) layer-wise
fencing on a side stream."""
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, strategies as st

from tokenspeed_lit.core.device import HAS_ACCEL, default_device
from tokenspeed_lit.core.streams import synchronize, new_stream, wait_event, use_stream
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.tiers.host_mirror import FlatHostMirror
from tokenspeed_lit.tiers.host_transport import _PageCopier, page_ids, _chunks, _pieces
from tokenspeed_lit.core.device import host_full
from tokenspeed_lit.core.copies import to_device_async, copy_2d
from tokenspeed_lit.core.graphs import capture
import numpy as np

DEV = default_device()
KERNEL_TRANSPORTS = ['zero_copy', 'staged']


@st.composite
def odd_pools(draw):
    "Protocol pools whose slices are 1, 2, 4, 8 or 16-byte multiples, so every word size of the kernel is exercised."
    ps, pages = draw(st.integers(1, 3)), draw(st.integers(2, 5))
    dtype = draw(st.sampled_from([torch.uint8, torch.bfloat16, torch.float32]))
    width = draw(st.integers(1, 9))
    layers = draw(st.integers(1, 3))
    ks = [torch.zeros(pages * ps, width, dtype=dtype, device=DEV) for _ in range(layers)]
    vs = [torch.zeros(pages * ps, width + draw(st.integers(0, 2)), dtype=dtype, device=DEV) for _ in range(layers)]
    state = [(torch.zeros(pages, draw(st.integers(1, 5)), dtype=torch.uint8, device=DEV),
              torch.zeros(pages, 3, dtype=torch.float32, device=DEV))] if draw(st.booleans()) else []
    return SimpleNamespace(page_size=ps, k_buffer=ks, v_buffer=vs, state_slabs=state)


def pools():
    return odd_pools() | st.builds(
        lambda ps, layers, slab, state, dtype: PagedKVPool(4, ps, layers, 2, 4, dtype, DEV, slab, state),
        st.sampled_from([1, 4, 16]), st.integers(1, 3), st.integers(1, 2), st.sets(st.integers(0, 0)),
        st.sampled_from([torch.bfloat16, torch.uint8]))


def randomise(m, g):
    for t, _ in m.tensor_pairs:
        flat = t.view(-1).view(torch.uint8)
        flat.copy_(torch.randint(0, 256, flat.shape, generator=g, dtype=torch.uint8).to(flat.device))


def payload(m):
    "The host bytes that belong to tensors (alignment padding between slices, if any, is nobody's)."
    return [hb.clone() for hb in m.host_bytes]


@st.composite
def pair_sets(draw, m):
    n = draw(st.integers(1, min(m.num_device_pages, m.num_host_pages)))
    d = draw(st.permutations(range(m.num_device_pages)))[:n]
    h = draw(st.permutations(range(m.num_host_pages)))[:n]
    return torch.tensor(list(zip(d, h)), dtype=torch.int64)


@given(pools(), st.sampled_from(KERNEL_TRANSPORTS), st.integers(2, 6), st.integers(0, 2**31 - 1), st.data())
def test_kernel_transports_equal_the_slice_reference(pool, transport, host_pages, seed, data):
    m = FlatHostMirror(pool, host_pages, transport='slices')
    g = torch.Generator().manual_seed(seed)
    randomise(m, g)
    pairs = data.draw(pair_sets(m))
    # reference: the slice loop
    m.host_pages.fill_(0x3C)
    m.store_pages(pairs); synchronize()
    want_host = payload(m)
    m.host_pages.copy_(torch.randint(0, 256, m.host_pages.shape, generator=g, dtype=torch.uint8))
    host_before = m.host_pages.clone()
    dev_before = [t.clone() for t, _ in m.tensor_pairs]
    m.load_pages(pairs); synchronize()
    want_dev = [t.clone() for t, _ in m.tensor_pairs]
    # the candidate, from the same starting points
    m.transport = transport
    if transport == 'staged':
        m._transport.set_chunk_pages(data.draw(st.integers(1, host_pages)), data.draw(st.integers(1, 3)))
    else: m._transport.set_pairs_per_call(data.draw(st.integers(1, host_pages)))    # chunks: one slot each
    for (t, _), b in zip(m.tensor_pairs, dev_before): t.copy_(b)
    m.host_pages.fill_(0x3C)
    m.store_pages(pairs); synchronize()
    assert all(map(torch.equal, payload(m), want_host)), 'store differs from the slice loop'
    m.host_pages.copy_(host_before)
    for (t, _), b in zip(m.tensor_pairs, dev_before): t.copy_(b)
    evs = m.load_pages_with_events(pairs)
    for e in evs: e.synchronize()
    for i, ((t, _), w) in enumerate(zip(m.tensor_pairs, want_dev)):
        assert torch.equal(t.view(-1).view(torch.uint8), w.view(-1).view(torch.uint8)), f'load differs, tensor {i}'


@given(odd_pools())
def test_unit_divides_every_offset(pool):
    m = FlatHostMirror(pool, 2)
    c = _PageCopier(m, m.host_pages)
    p = m.layout
    assert c.unit in (1, 2, 4, 8, 16)
    assert all(o % c.unit == 0 and s % c.unit == 0 for o, s in zip(p.offsets, p.slice_bytes))
    assert p.page_bytes % c.unit == 0
    assert c.vec * c.anchor.element_size() == c.unit


@given(st.lists(st.integers(0, 11), min_size=1, max_size=12, unique=True), st.integers(1, 12))
def test_staged_copies_one_run_per_chunk_run(hosts, cap):
    pool = PagedKVPool(13, 2, 1, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 12, transport='staged')
    m._transport.set_chunk_pages(cap)
    pairs = torch.tensor([(i + 1, h) for i, h in enumerate(hosts)])
    m.store_pages(pairs); synchronize()
    s = sorted(hosts)
    runs = 0
    for c0, c1 in _chunks(len(s), cap):                          # a store's chunks ramp up from a small one
        chunk = s[c0:c1]
        runs += 1 + sum(b != a + 1 for a, b in zip(chunk, chunk[1:]))
    assert m._transport.last_copies == runs


@given(st.lists(st.integers(1, 50), max_size=6), st.one_of(st.none(), st.integers(1, 20)))
def test_pieces_cover_each_copy_exactly(sizes, piece):
    "Pieces of at most `piece` bytes, in order, tile every copy: same bytes, same place on both sides."
    n = len(sizes)
    dst, src = np.arange(n) * 1000, np.arange(n) * 1000 + 77
    d, s, k = _pieces(dst, src, np.array(sizes, np.int64), piece)
    want = [(a + o, b + o) for a, b, z in zip(dst, src, sizes) for o in range(z)]
    got = [(int(x) + o, int(y) + o) for x, y, z in zip(d, s, k) for o in range(int(z))]
    assert got == want
    if piece is not None: assert all(0 < z <= piece for z in k)


@given(st.integers(1, 40), st.integers(1, 6))
def test_staged_round_trip_in_small_dma_pieces(piece, cap):
    "Pages larger than the DMA piece cross in several pieces, and the bytes are still the reference's."
    pool = PagedKVPool(7, 2, 1, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 6, transport='staged')
    randomise(m, torch.Generator().manual_seed(piece))
    m._transport.set_chunk_pages(cap); m._transport.dma_piece_bytes = piece
    pairs = [(1, 4), (2, 0), (3, 1), (5, 5)]
    want = [t.clone() for t, _ in m.tensor_pairs]
    m.store_pages(pairs); synchronize()
    assert m._transport.last_copies >= -(-m.bytes_per_host_page() // piece)
    for t, _ in m.tensor_pairs: t.zero_()
    m.load_pages(pairs); synchronize()
    for (t, _), w in zip(m.tensor_pairs, want):
        for d, _h in pairs:
            rows = slice(d * 2, d * 2 + 2)
            assert torch.equal(t[rows].view(torch.uint8), w[rows].view(torch.uint8))


@given(st.integers(0, 3), st.integers(0, 3), st.integers(0, 6), st.integers(0, 4), st.integers(0, 3), st.integers(0, 3),
       st.booleans())
def test_copy_2d_moves_exactly_the_rows(dst_off, src_off, width, height, dst_extra, src_extra, to_device):
    "`copy_2d` against numpy: row i of `width` bytes lands at `dst_off + i * dst_pitch`; every other byte is untouched."
    dp, sp = width + dst_extra, width + src_extra
    src = host_full((64,), 0, torch.uint8); src.copy_(torch.randperm(256)[:64].to(torch.uint8))
    dst = torch.full((64,), 0xEE, dtype=torch.uint8, device=DEV if to_device else 'cpu')
    copy_2d(dst, dst_off, dp, src, src_off, sp, width, height); synchronize()
    want = np.full(64, 0xEE, np.uint8)
    for i in range(height): want[dst_off + i * dp:dst_off + i * dp + width] = src.numpy()[src_off + i * sp:src_off + i * sp + width]
    assert np.array_equal(dst.cpu().numpy(), want)


@given(st.lists(st.integers(0, 11), min_size=1, max_size=12, unique=True), st.integers(1, 12), st.sampled_from([None, 1, 2, 3]))
def test_fenced_load_in_columns_equals_the_reference(hosts, cap, min_run):
    "A fenced load whose runs of host pages cross as 2-D copies scatters the same bytes, and costs one copy per run."
    pool = PagedKVPool(13, 2, 2, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 12, transport='staged', fence_groups=2)
    randomise(m, torch.Generator().manual_seed(cap))
    st_ = m._transport
    st_.set_chunk_pages(cap); st_.min_column_pages = min_run
    pairs = [(i + 1, h) for i, h in enumerate(hosts)]
    want = [t.clone() for t, _ in m.tensor_pairs]
    m.store_pages(pairs); synchronize()
    for t, _ in m.tensor_pairs: t.zero_()
    m.load_pages_with_events(pairs); synchronize()
    for (t, _), w in zip(m.tensor_pairs, want):
        for d, _h in pairs:
            assert torch.equal(t[d * 2:d * 2 + 2].view(torch.uint8), w[d * 2:d * 2 + 2].view(torch.uint8))
    s, copies = sorted(hosts), 0
    group_cap = st_._group_copier(0, m.fence_tensor_groups[0])[1]
    for c0, c1 in _chunks(len(s), group_cap, small_last=True, ramp=False):
        chunk = s[c0:c1]
        runs = np.split(chunk, np.flatnonzero(np.diff(chunk) != 1) + 1)
        copies += sum(1 if (min_run is not None and len(r) >= min_run) else len(r) for r in runs)
    assert st_.last_copies == copies * m.fence_groups


@given(st.integers(0, 2**31 - 1), st.integers(-3, 40),
       st.lists(st.tuples(st.integers(-3, 8), st.integers(-3, 8)), max_size=6, unique_by=lambda p: p[1]))
def test_page_copy_kernel_moves_only_valid_pairs(seed, claimed, pairs):
    "Whatever the ids say (a count past the buffer, pages outside the pool or the block), only valid pairs move."
    pool = PagedKVPool(5, 2, 2, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 4, transport='slices')
    randomise(m, torch.Generator().manual_seed(seed))
    block = torch.full((m.num_host_pages + 2, m.bytes_per_host_page()), 0xEE, dtype=torch.uint8, device=DEV)
    view = block[1:-1]                                  # guard pages on both sides of the block the kernel sees
    c = _PageCopier(m, view)
    ids = page_ids(np.array(pairs, dtype=np.int64).reshape(-1, 2))
    ids[0] = claimed
    c.launch(to_device_async(ids, DEV), m.issue_order, to_block=True); synchronize()
    want = torch.full_like(block, 0xEE)
    for d, h in pairs[:max(0, min(claimed, len(pairs)))]:
        if 0 <= d < m.num_device_pages and 0 <= h < m.num_host_pages:
            for t, (o, n) in enumerate(zip(m.layout.offsets, m.layout.slice_bytes)):
                want[1 + h, o:o + n] = m.dev_bytes[t][d].to(want.device)
    assert torch.equal(block, want)


@given(st.integers(0, 300), st.integers(1, 40), st.booleans(), st.booleans())
def test_chunks_cover_every_item_once(n, cap, small_last, ramp):
    cs = _chunks(n, cap, small_last, ramp)
    assert [i for a, b in cs for i in range(a, b)] == list(range(n))
    assert all(0 < b - a <= cap for a, b in cs)
    sizes = [b - a for a, b in cs]
    if ramp:                          # each at most twice the one before (a small last chunk may follow any)
        head = sizes[:-1] if small_last else sizes
        assert all(b <= 2 * a for a, b in zip(head, head[1:]))
        if sizes: assert sizes[0] <= max(1, cap // 8)


def test_warmup_captures_and_compiles_everything_up_front():
    pool = PagedKVPool(6, 2, 2, 1, 4, device=DEV)
    for transport in ('zero_copy', 'staged'):
        m = FlatHostMirror(pool, 5, transport=transport).warmup()
        before = capture.calls
        from tokenspeed_lit.tiers.host_transport import _page_copy, _ids_stage
        compiled = (len(_page_copy.cache), len(_ids_stage.cache))
        for n in (1, 3, 5):
            pairs = [(d + 1, h) for d, h in zip(range(n), range(n))]
            m.store_pages(pairs); m.load_pages(pairs); m.load_pages_with_events(pairs)
        synchronize()
        assert capture.calls == before, f'{transport}: a call captured a graph after warmup()'
        assert (len(_page_copy.cache), len(_ids_stage.cache)) == compiled, f'{transport}: a call compiled after warmup()'


def test_a_mirror_of_the_default_transport_is_warm_from_construction():
    "An engine that never calls warmup() still compiles and captures nothing on its first calls (issue 29)."
    from tokenspeed_lit.tiers.host_transport import _page_copy, _ids_stage
    pool = PagedKVPool(6, 2, 2, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 5)                           # no warmup(): the default transport warms itself
    before, compiled = capture.calls, (len(_page_copy.cache), len(_ids_stage.cache))
    pairs = [(1, 0), (2, 3)]
    m.store_pages(pairs); m.load_pages(pairs); m.load_pages_with_events(pairs)
    synchronize()
    assert capture.calls == before and (len(_page_copy.cache), len(_ids_stage.cache)) == compiled
    cold = FlatHostMirror(pool, 5, warmup=False)           # asked not to: the first call pays (on a GPU)
    assert cold.transport == m.transport


def test_fence_groups_never_split_a_layer():
    pool = PagedKVPool(4, 2, 6, 1, 4, device=DEV, state_layers=[3])
    m = FlatHostMirror(pool, 2, transport='zero_copy', fence_groups=7)
    evs = m.load_pages_with_events([(1, 0)])
    assert len(evs) == 10 + 2 and m.fence_groups == 6           # 6 layers: at most one group each
    for l in range(6):
        idx = m.state_tensor_indices_of_layer(l) or (m.tensor_index_of_layer(l),
                                                     m.tensor_index_of_layer(l) + m.num_k_tensors)
        assert evs[idx[0]] is evs[idx[1]]
    assert len({id(e) for e in evs}) == 6
    for k, want in [(2, 2), (1, 1), (11, 6), (12, 12), (40, 12)]:
        m.fence_groups = k
        assert m.fence_groups == want
        assert len({id(e) for e in m.load_pages_with_events([(1, 0)])}) == want


@pytest.mark.skipif(not HAS_ACCEL, reason='needs a GPU: streams and events are real only there')
@pytest.mark.parametrize('transport,background', [('slices', False), ('zero_copy', False), ('staged', False),
                                                  ('staged', True), ('zero_copy', True)])
def test_gpu_layerwise_fencing_reads_only_landed_layers(transport, background):
    "A consumer stream that waits on one layer's events, then copies that layer, sees the loaded bytes."
    L, pages, ps = 8, 64, 16
    pool = PagedKVPool(pages + 1, ps, L, 8, 128, device=DEV)
    m = FlatHostMirror(pool, pages, transport=transport, fence_groups=L)
    for t, _ in m.tensor_pairs: t.view(torch.uint8).random_(0, 256)
    pairs = torch.stack([torch.arange(1, pages + 1), torch.randperm(pages)], 1)
    m.store_pages(pairs); synchronize()
    want = [pool.k_of(l)[ps:].clone() for l in range(L)]      # pages 1..: page 0 (the dummy page) is not loaded
    for t, _ in m.tensor_pairs: t.zero_()
    xfer, consumer = new_stream(), new_stream()
    synchronize()
    if background: m.warmup()
    evs = m.load_pages_with_events(pairs, stream=xfer, background=background)
    got = []
    with use_stream(consumer):
        for l in range(L):
            wait_event(evs[m.tensor_index_of_layer(l)], consumer)
            got.append(pool.k_of(l)[ps:].clone())
    synchronize()
    for l in range(L):   # bytes, not values: random bf16 bytes include NaNs, which never compare equal
        assert torch.equal(got[l].view(torch.uint8), want[l].view(torch.uint8)), f"layer {l} read before it landed"


@pytest.mark.skipif(not HAS_ACCEL, reason='needs a GPU')
def test_gpu_host_pages_are_pinned_and_default_is_a_kernel_transport():
    pool = PagedKVPool(3, 4, 2, 2, 8, device=DEV)
    m = FlatHostMirror(pool, 2)
    assert m.host_pages.is_pinned()
    from tokenspeed_lit.tiers.host_transport import ACCEL_TRANSPORT
    assert m.transport == ACCEL_TRANSPORT


def test_zero_copy_pairs_per_call_is_checked():
    m = FlatHostMirror(PagedKVPool(3, 2, 1, 1, 4, device=DEV), 2, transport='zero_copy')
    with pytest.raises(ValueError, match='pairs'): m._transport.set_pairs_per_call(0)


def test_zero_copy_empty_call_records_events_and_moves_nothing():
    pool = PagedKVPool(3, 2, 2, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 2, transport='zero_copy')
    m.host_pages.fill_(0x77)
    assert m.store_pages([]) is None
    evs = m.load_pages_with_events(torch.empty(0, 2, dtype=torch.int64))
    assert len(evs) == len(m.tensor_pairs) and all(e is not None for e in evs)
    for e in evs: e.synchronize()
    assert (m.host_pages == 0x77).all()


@pytest.mark.skipif(not HAS_ACCEL, reason='needs a GPU: only there can the host run ahead of queued copies')
def test_gpu_host_running_ahead_never_rewrites_queued_page_ids():
    "Many calls queued behind a long kernel: each needs its own slot (the ring grows, then waits); all bytes land."
    calls, per = 12, 4
    pool = PagedKVPool(calls * per + 1, 16, 4, 8, 128, device=DEV)
    m = FlatHostMirror(pool, calls * per, transport='zero_copy')
    for t, _ in m.tensor_pairs: t.view(torch.uint8).random_(0, 256)
    for _ in range(2): m.store_pages([(1, 0)])                   # capture the store graphs of the first slots
    synchronize()
    m.host_pages.fill_(0)
    torch.cuda._sleep(50_000_000)                                # ~25 ms: every call below is queued behind it
    for c in range(calls):                                       # each call: its own device and host pages
        m.store_pages([(1 + c * per + k, calls * per - 1 - (c * per + k)) for k in range(per)])
    synchronize()
    zc = m._transport
    assert 2 < len(zc._slots) <= zc.max_slots
    for c in range(calls):
        for k in range(per):
            d, h = 1 + c * per + k, calls * per - 1 - (c * per + k)
            for (t, hv), span in zip(m.tensor_pairs, m.row_spans):
                got = hv[h].reshape(-1).view(torch.uint8).cpu()
                want = t[d * span:(d + 1) * span].reshape(-1).view(torch.uint8).cpu()
                assert torch.equal(got, want), f'call {c}, pair ({d}, {h})'

