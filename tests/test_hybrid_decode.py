"""PagedHybrid.decode (nbs/demo/models/28_hybrid_decode: the decode forward a captured graph runs, every index read on the device,
the rows batched) against the eager row-by-row forward (PagedHybrid.forward, every index checked on the host) on the
same staged step: random states in every slab row, random K and V, working rows, verify checkpoints, a copy on
write, -1 where a row has none, padded rows. The logits, K, V, working states and checkpoints must agree within float
tolerance (the eager path runs two tokens with the chunked delta rule, the batched one token by token); every other
state row must be bit for bit what it was, but the padding row's: padded rows never touch a live row or a checkpoint,
and a -1 is never read or written as row 0 or the last row."""
import random
import pytest
import torch
from tokenspeed_lit.core.device import default_device
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.staging.input_buffers import InputBuffers, RuntimeStates
from tokenspeed_lit.staging.step_plan import ForwardOp
from tokenspeed_lit.demo.models.hybrid import PagedHybrid, state_shapes, tiny_qwen35

DEV = default_device()
MODEL = tiny_qwen35(seed=3, device=DEV)
MAX_BS, L, PS, PAGES, PAD = 6, 2, 4, 96, 5        # PAD: the padding state row (rows 0 and PAGES - 1 are never used)


def _step(seed: int, live: int, cow: bool = True):
    "A decode step of `live` rows of L tokens, padded to MAX_BS, staged with fill_input_buffers over poisoned slabs: (model, bufs, rows touched by right)."
    rnd, c = random.Random(seed), MODEL.config
    g = torch.Generator().manual_seed(seed)
    pool = PagedKVPool(PAGES, PS, c.num_hidden_layers, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                       dtype=torch.float32, device=DEV, **state_shapes(MODEL))
    for conv, ssm in pool.state_slabs:                 # poison: every row a random state
        conv.copy_(torch.randn(conv.shape, generator=g)); ssm.copy_(torch.randn(ssm.shape, generator=g) * 0.3)
    for l in range(c.num_hidden_layers):
        if l not in pool.state_layers:
            pool.k_of(l).copy_(torch.randn(pool.k_of(l).shape, generator=g))
            pool.v_of(l).copy_(torch.randn(pool.v_of(l).shape, generator=g))
    bufs = InputBuffers(MAX_BS, MAX_BS * L, PS, dummy_kv_slot=0, state_write_padding_pool_index=PAD, device=DEV,
                        has_mamba=True)
    rs = RuntimeStates(MAX_BS, c.vocab_size, L, device=DEV)
    table = torch.full((MAX_BS + 1, 8), -1, dtype=torch.int32, device=DEV); table[0] = 0
    free = [p for p in range(1, PAGES - 1) if p != PAD]
    rnd.shuffle(free)
    work, track, cows, marks = [], [], [], []
    for i in range(live):
        cache = rnd.randint(3, 20)
        pages = [free.pop() for _ in range(-(-(cache + L) // PS))]
        table[i + 1, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        rs.valid_cache_lengths[i + 1] = cache
        rs.future_input_map[i + 1] = torch.tensor([rnd.randrange(c.vocab_size) for _ in range(L)], dtype=torch.int32)
        rs.remote_spec_candidate_ready[i + 1] = True
        work.append(free.pop())
        with_track = rnd.random() < 0.6
        track.append(free.pop() if with_track else -1); marks.append(cache + 1 if with_track else -1)
        cows.append(free.pop() if cow and i == 1 else -1)
    op = ForwardOp(request_ids=list(range(live)), request_pool_indices=[i + 1 for i in range(live)],
                   input_lengths=[L] * live, decode_input_ids=[-1] * live, mamba_pool_indices=work,
                   mamba_cow_src_indices=cows, mamba_branching_seqlens=marks, mamba_track_pool_indices=track)
    bufs.fill_input_buffers(op, rs, table, live * L, table_order='pool')
    model = PagedHybrid(MODEL, pool, bufs, table, 'pool')
    return model, work + [t for t in track if t >= 0]


def _snapshot(pool):
    return ([t.clone() for pair in pool.state_slabs for t in pair] +
            [t.clone() for t in pool.k_buffer + pool.v_buffer if t is not None])


def _restore(pool, snap):
    for t, s in zip([t for pair in pool.state_slabs for t in pair] + [t for t in pool.k_buffer + pool.v_buffer
                                                                      if t is not None], snap): t.copy_(s)


def _rows_changed(pool, snap) -> set:
    out = set()
    for (conv, ssm), c0, s0 in zip(pool.state_slabs, snap[0::2], snap[1::2]):
        moved = (conv != c0).flatten(1).any(1) | (ssm != s0).flatten(1).any(1)
        out |= set(moved.nonzero().flatten().tolist())
    return out


@pytest.mark.parametrize('seed,live', [(0, 6), (1, 4), (2, 3), (3, 1)])
def test_batched_decode_equals_the_row_by_row_forward(seed, live):
    model, touched = _step(seed, live)
    pool, N = model.pool, MAX_BS * L
    snap = _snapshot(pool)
    eager = model.forward(N, MAX_BS)[:live * L].clone()
    want = _snapshot(pool)
    _restore(pool, snap)
    got = model.decode(N, MAX_BS)[:live * L]
    assert (got - eager).abs().max().item() < 1e-5
    now = _snapshot(pool)
    for (a, b, a0) in zip(now[:len(pool.state_slabs) * 2], want, snap):
        for r in touched: assert (a[r] - b[r]).abs().max().item() < 1e-5, r       # working rows and checkpoints
    for a, b in zip(now[len(pool.state_slabs) * 2:], want[len(pool.state_slabs) * 2:]):
        assert (a[PS:] - b[PS:]).abs().max().item() < 1e-5      # K and V (the dummy page 0: the padded tokens' scratch)
    changed = _rows_changed(pool, snap)
    assert changed <= set(touched) | {PAD} and set(touched) <= changed, (changed, touched)
    assert PAD in changed or live == MAX_BS     # padded rows write it (and rows without a checkpoint: scratch)


@pytest.mark.parametrize('bad', [-1, PAGES, -7])
def test_padded_rows_never_touch_a_live_row(bad):
    "A padded row whose write row is staged as -1 (or past the pool, or another negative) writes the padding row: never row 0, the last row, or a live row; its -1 Mamba indices read nothing."
    model, touched = _step(7, 3, cow=False)
    b, pool = model.bufs, model.pool
    b.state_write_req_pool_indices_buf[4] = bad
    b.mamba_track_pool_indices_buf[5], b.mamba_branching_seqlens_buf[5] = -1, 99   # a padded row's stray length
    snap = _snapshot(pool)
    model.decode(MAX_BS * L, MAX_BS)
    changed = _rows_changed(pool, snap)
    assert changed <= set(touched) | {PAD} and PAD in changed and not changed & {0, PAGES - 1}, changed
    model2, _ = _step(7, 3, cow=False)                 # the same step without the bad index: the same live states
    model2.decode(MAX_BS * L, MAX_BS)
    for (c, s), (c2, s2) in zip(pool.state_slabs, model2.pool.state_slabs):
        for r in touched: assert torch.equal(c[r], c2[r]) and torch.equal(s[r], s2[r]), r


def test_a_padded_row_staged_onto_a_live_row_shows_in_that_row():
    "What --fault padded-state-write does: the padded row's write wins over the live row's, so the state check sees it."
    model, touched = _step(8, 3, cow=False)
    snap = _snapshot(model.pool)
    model.decode(MAX_BS * L, MAX_BS)
    good = [(c[touched[0]].clone(), s[touched[0]].clone()) for c, s in model.pool.state_slabs]
    _restore(model.pool, snap)
    model.bufs.state_write_req_pool_indices_buf[MAX_BS - 1] = touched[0]
    model.decode(MAX_BS * L, MAX_BS)
    assert any(not torch.equal(c[touched[0]], c0) for (c, _), (c0, _) in zip(model.pool.state_slabs, good))
