"""Property tests of `tokenspeed_lit.tiers.host_mirror`: byte-exact round trips with a sentinel per (tensor, page) in every
layout and dtype, pages no pair names stay untouched, accounting, layer lookups, events, and every bad pair raising
`ValueError` before any byte moves."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from tokenspeed_lit.core.device import HAS_ACCEL, default_device
from tokenspeed_lit.core.streams import CompletedEvent, synchronize
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.tiers.host_mirror import FlatHostMirror, flat_bytes_per_host_page

DEV = default_device()
FP8 = getattr(torch, 'float8_e4m3fn', None)
DTYPES = [torch.bfloat16, torch.uint8, torch.float32] + ([FP8] if FP8 is not None else [])
# transports that can run here without compiled kernels (the GPU transports have their own tests)
TRANSPORTS = ['slices', 'zero_copy', 'staged'] + ([] if HAS_ACCEL else ['index'])


@st.composite
def pools(draw):
    "A PagedKVPool in a random layout (per-layer / slab, with or without state layers), page size and dtype."
    layers = draw(st.integers(1, 5))
    state = draw(st.sets(st.integers(0, layers - 1), max_size=layers - 1)) if draw(st.booleans()) else set()
    return PagedKVPool(num_pages=draw(st.integers(2, 7)), page_size=draw(st.sampled_from([1, 2, 4, 16])),
                       num_layers=layers, num_kv_heads=draw(st.integers(1, 3)), head_dim=draw(st.sampled_from([2, 8])),
                       dtype=draw(st.sampled_from(DTYPES)), device=DEV, layers_per_slab=draw(st.integers(1, 3)),
                       state_layers=state, conv_shape=(draw(st.integers(1, 4)), 2), ssm_shape=(2, 3),
                       conv_dtype=draw(st.sampled_from(DTYPES)))


@st.composite
def hand_pools(draw):
    "A protocol-only pool: the same slab object at several layers, None layers, state via get_state_buffers."
    ps, pages = draw(st.sampled_from([1, 3, 4])), draw(st.integers(2, 6))
    dtype = draw(st.sampled_from(DTYPES))
    n_slabs = draw(st.integers(1, 3))
    ks = [torch.zeros(pages * ps, draw(st.integers(1, 3)), 4, dtype=dtype, device=DEV) for _ in range(n_slabs)]
    vs = [torch.zeros_like(k) for k in ks]
    kinds = draw(st.lists(st.integers(-1, n_slabs - 1), min_size=1, max_size=7))   # -1: a state layer
    kinds[0] = max(kinds[0], 0)
    used = sorted(set(k for k in kinds if k >= 0))
    ks, vs = [ks[i] for i in used], [vs[i] for i in used]
    remap = {old: new for new, old in enumerate(used)}
    states = {l: (torch.zeros(pages, 4, dtype=torch.bfloat16, device=DEV), torch.zeros(pages, 2, 2, device=DEV))
              for l, k in enumerate(kinds) if k < 0}
    def get_state_buffers(layer):
        if layer not in states: raise ValueError(f'layer {layer} has no state')
        return states[layer]
    return SimpleNamespace(page_size=ps, k_buffer=[ks[remap[k]] if k >= 0 else None for k in kinds],
                           v_buffer=[vs[remap[k]] if k >= 0 else None for k in kinds],
                           state_slabs=list(states.values()), get_state_buffers=get_state_buffers)


any_pool = pools() | hand_pools()


def dev_bytes(t, page, span):
    return t[page * span:(page + 1) * span].reshape(-1).view(torch.uint8).cpu()


def fill(mirror, seed):
    "Give every (tensor, page) of the device side its own byte pattern; return the patterns per tensor."
    pats = []
    for i, (t, _) in enumerate(mirror.tensor_pairs):
        flat = t.view(-1).view(torch.uint8)
        n = flat.numel()
        pat = ((torch.arange(n) * 7 + i * 131 + seed * 17 + torch.arange(n) // 97) % 253 + 1).to(torch.uint8)
        flat.copy_(pat.to(flat.device))
        pats.append(pat)
    return pats


@st.composite
def pair_sets(draw, mirror):
    "Distinct device pages and distinct host pages, randomly matched (possibly none)."
    n = draw(st.integers(0, min(mirror.num_device_pages, mirror.num_host_pages)))
    d = draw(st.permutations(range(mirror.num_device_pages)))[:n]
    h = draw(st.permutations(range(mirror.num_host_pages)))[:n]
    return list(zip(d, h))


@given(any_pool, st.integers(1, 6), st.sampled_from(TRANSPORTS), st.booleans(), st.booleans(), st.data())
def test_round_trip_is_byte_exact_and_leaves_other_pages_alone(pool, host_pages, transport, as_tensor, background, data):
    "background: the calls go through the mirror's issue thread and return pending events; the bytes are the same."
    m = FlatHostMirror(pool, host_pages, transport=transport)
    pairs = data.draw(pair_sets(m))
    arg = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2) if as_tensor else pairs
    fill(m, seed=1)
    m.host_pages.fill_(0xAB)
    m.store_pages(arg, background=background)
    synchronize()
    stored = {h: d for d, h in pairs}
    for i, ((t, host), span) in enumerate(zip(m.tensor_pairs, m.row_spans)):
        for h in range(m.num_host_pages):
            got = host[h].reshape(-1).view(torch.uint8)
            if h in stored: assert torch.equal(got, dev_bytes(t, stored[h], span)), (i, h)
            else: assert (got == 0xAB).all(), f'host page {h} of tensor {i} was not named but changed'
    # now overwrite the device side with other patterns and load the stored pages back elsewhere
    pats = fill(m, seed=2)
    loads = [(d, h) for (d, h) in zip(data.draw(st.permutations(range(m.num_device_pages))), list(stored))]
    evs = m.load_pages_with_events(loads, background=background)
    for e in evs: e.synchronize()
    loaded = dict(loads)
    for i, ((t, host), span) in enumerate(zip(m.tensor_pairs, m.row_spans)):
        for d in range(m.num_device_pages):
            got = dev_bytes(t, d, span)
            if d in loaded: assert torch.equal(got, host[loaded[d]].reshape(-1).view(torch.uint8)), (i, d)
            else:
                w = got.numel()
                assert torch.equal(got, pats[i][d * w:(d + 1) * w]), f'device page {d} of tensor {i} changed'


@given(any_pool, st.integers(1, 4))
def test_accounting_is_the_sum_over_tensors(pool, host_pages):
    m = FlatHostMirror(pool, host_pages)
    slices = [t.element_size() * t[0].numel() * s for (t, _), s in zip(m.tensor_pairs, m.row_spans)]
    assert m.bytes_per_host_page() == flat_bytes_per_host_page(pool)
    assert m.host_pages.numel() == host_pages * m.bytes_per_host_page()
    biggest = max(t.element_size() for t, _ in m.tensor_pairs)
    if all(s % biggest == 0 for s in slices):           # every real model: no alignment padding at all
        assert m.bytes_per_host_page() == sum(slices)
    else:
        assert 0 <= m.bytes_per_host_page() - sum(slices) < biggest * len(slices)
    # every distinct tensor exactly once, None skipped, K then V then state
    distinct = {id(t) for t in pool.k_buffer + pool.v_buffer if t is not None}
    distinct |= {id(t) for pair in getattr(pool, 'state_slabs', []) for t in pair}
    assert sorted(id(t) for t, _ in m.tensor_pairs) == sorted(distinct)


@given(any_pool)
def test_layer_lookups(pool):
    m = FlatHostMirror(pool, 2)
    for layer, k in enumerate(pool.k_buffer):
        state = m.state_tensor_indices_of_layer(layer)
        if k is None:
            with pytest.raises(ValueError, match='state layer'): m.tensor_index_of_layer(layer)
        else:
            i = m.tensor_index_of_layer(layer)
            assert m.tensor_pairs[i][0] is k and i < m.num_k_tensors
            assert m.tensor_pairs[i + m.num_k_tensors][0] is pool.v_buffer[layer]
        try: conv, ssm = pool.get_state_buffers(layer)
        except ValueError: assert state is None; continue
        assert m.tensor_pairs[state[0]][0] is conv and m.tensor_pairs[state[1]][0] is ssm
        assert m.row_spans[state[0]] == m.row_spans[state[1]] == 1


@given(any_pool, st.sampled_from(TRANSPORTS), st.one_of(st.none(), st.integers(1, 9)))
def test_events_one_per_tensor_in_groups(pool, transport, groups):
    m = FlatHostMirror(pool, 3, transport=transport, fence_groups=groups)
    evs = m.load_pages_with_events([(1, 0)])
    assert len(evs) == len(m.tensor_pairs) and all(e is not None for e in evs)
    assert len({id(e) for e in evs}) == m.fence_groups
    k = groups if groups is not None else m._transport.default_fence_groups
    n, units = len(evs), m.layout.units
    assert m.fence_groups == (n if k is None or k >= n else min(k, len(units)))
    if m.fence_groups < n:                                   # groups join whole layers' worth of tensors
        assert all(len({id(evs[i]) for i in unit}) == 1 for unit in units)
    if not HAS_ACCEL: assert all(isinstance(e, CompletedEvent) for e in evs)
    for e in evs: e.synchronize()
    assert all(e.query() for e in evs)


BAD = ['device_high', 'device_negative', 'host_high', 'host_negative', 'duplicate_destination',
       'flat', 'single', 'triple', 'float', 'none']      # malformed pairs: named, never numpy's or Python's error


@given(any_pool, st.sampled_from(BAD), st.booleans(), st.sampled_from(TRANSPORTS), st.data())
def test_bad_pairs_raise_before_any_byte_moves(pool, kind, store, transport, data):
    m = FlatHostMirror(pool, 3, transport=transport)
    pairs = data.draw(pair_sets(m))
    D, H = m.num_device_pages, m.num_host_pages
    bad = {'device_high': (data.draw(st.integers(D, D + 5)), 0), 'device_negative': (data.draw(st.integers(-5, -1)), 0),
           'host_high': (0, data.draw(st.integers(H, H + 5))), 'host_negative': (0, data.draw(st.integers(-5, -1))),
           'flat': 0, 'single': (0,), 'triple': (0, 0, 0), 'float': (0.5, 0), 'none': (None, 0)}
    if kind == 'duplicate_destination':
        pairs = pairs or [(0, 0)]
        d, h = pairs[0]
        bad_pair = ((d + 1) % D, h) if store else (d, (h + 1) % H)     # same destination, other source
    else: bad_pair = bad[kind]
    pos = data.draw(st.integers(0, len(pairs)))
    pairs = pairs[:pos] + [bad_pair] + pairs[pos:]
    fill(m, seed=3)
    m.host_pages.fill_(0x5A)
    before_dev = [t.clone() for t, _ in m.tensor_pairs]
    with pytest.raises(ValueError, match='pairs'):
        (m.store_pages if store else m.load_pages)(pairs)
    synchronize()
    assert (m.host_pages == 0x5A).all()
    assert all(torch.equal(t.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
               for (t, _), b in zip(m.tensor_pairs, before_dev))


def test_device_tensor_pairs_are_refused():
    pool = PagedKVPool(3, 2, 1, 1, 2, device=DEV)
    m = FlatHostMirror(pool, 2)
    if HAS_ACCEL:
        with pytest.raises(ValueError, match='on the host'): m.store_pages(torch.tensor([[1, 0]], device=DEV))
    with pytest.raises(ValueError, match='integer dtype'): m.store_pages([(1.5, 0)])


@pytest.mark.parametrize('pairs, msg', [
    ([1, 2], 'got pairs[0] = 1'),
    ([(1, 0), (2,)], 'got pairs[1] = (2,)'),
    ([(1, 0), (2, 1, 0)], 'got pairs[1] = (2, 1, 0)'),
    (5, 'pairs must be an iterable of (device_page, host_page) pairs, got int'),
    ([(1, 'a')], 'pairs must have an integer dtype'),
    (np.array([1, 0]), 'got shape (2,)'),
    (torch.tensor([[1.0, 0.0]]), 'pairs must have an integer dtype'),
])
def test_malformed_pairs_are_named(pairs, msg):
    m = FlatHostMirror(PagedKVPool(3, 2, 1, 1, 2, device=DEV), 2)
    for call in (m.store_pages, m.load_pages, m.load_pages_with_events):
        with pytest.raises(ValueError) as e:
            call(pairs)
        assert msg in str(e.value)


def test_background_calls_keep_call_order_and_report_failures():
    """A background store, then a plain load of the same pages: the load sees the stored bytes (calls run in call
    order); a background call that fails raises from its events, and the mirror goes on working."""
    from tokenspeed_lit.core.streams import PendingEvent
    pool = PagedKVPool(5, 2, 2, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 4)
    pats = fill(m, seed=3)
    for (t, _), span in zip(m.tensor_pairs, m.row_spans): t[3 * span:].zero_()
    synchronize()
    done = m.store_pages([(1, 0), (2, 3)], background=True)
    assert isinstance(done, PendingEvent)
    m.load_pages([(3, 0), (4, 3)]); synchronize()     # issued after the store: reads what it wrote
    for i, ((t, _), span) in enumerate(zip(m.tensor_pairs, m.row_spans)):
        w = pats[i].view(m.num_device_pages, -1)
        assert torch.equal(dev_bytes(t, 3, span), w[1]) and torch.equal(dev_bytes(t, 4, span), w[2])
    real = m._transport.move
    def broken(*a, **k): raise RuntimeError('driver said no')
    m._transport.move = broken
    evs = m.load_pages_with_events([(1, 0)], background=True)
    with pytest.raises(RuntimeError, match='background call'): evs[0].synchronize()
    m._transport.move = real
    m.load_pages([(1, 0)]); synchronize()                    # the issue thread survived the failure


def test_background_calls_start_after_the_callers_stream_through_a_small_event_ring():
    """Background stores issued right after slow device writes on the caller's stream store the written bytes, with
    the start-event ring far smaller than the number of calls in flight (it wraps, or falls back to fresh events
    while the issue thread is behind); each call stores a page nobody writes again, so only a call that started too
    early could read anything but its value (on a GPU)."""
    from tokenspeed_lit.core.streams import EventRing, new_stream, use_stream
    pool = PagedKVPool(26, 2, 1, 1, 4, device=DEV)
    m = FlatHostMirror(pool, 24)
    m.store_pages([(25, 0)], background=True); synchronize()   # makes the issue thread and the ring
    m._starts = EventRing(DEV, size=2)
    s = new_stream(DEV)
    k = m.tensor_pairs[0][0]
    with use_stream(s):
        for h in range(24):
            if HAS_ACCEL: torch.cuda._sleep(2_000_000)          # ~1 ms: a call that did not wait would read zeros
            k[2 * (h + 1):2 * (h + 2)].fill_(h + 1)
            m.store_pages([(h + 1, h)], stream=s, background=True)
    synchronize()
    assert m._starts.issued == m._starts.consumed == 24
    for h in range(24):
        assert torch.all(m.tensor_pairs[0][1][h] == h + 1).item(), h


@pytest.mark.parametrize('n', [3, 4096, 4097, 6000])
def test_pair_checks_find_a_duplicate_at_any_size(n):
    "Up to 4096 pairs the duplicate check is a set, beyond it a sort: both name the page, and neither refuses distinct pairs."
    pool = PagedKVPool(n + 2, 1, 1, 1, 2, torch.uint8, DEV)
    m = FlatHostMirror(pool, n + 1)
    pairs = np.stack([np.arange(n) + 1, np.random.default_rng(n).permutation(n)], 1)
    assert np.array_equal(m._pages(pairs, True), pairs) and np.array_equal(m._pages(pairs, False), pairs)
    dup = pairs.copy(); dup[-1, 1] = dup[0, 1]
    with pytest.raises(ValueError, match=f'two pairs store into host page {dup[0, 1]}'): m._pages(dup, True)
    dup = pairs.copy(); dup[-1, 0] = dup[1, 0]
    with pytest.raises(ValueError, match=f'two pairs load into device page {dup[1, 0]}'): m._pages(dup, False)
    bad = pairs.copy(); bad[n // 2, 0] = -1
    with pytest.raises(ValueError, match=rf'pairs\[{n // 2}\] = \(-1, '): m._pages(bad, True)
