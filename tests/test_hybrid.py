"""PagedHybrid (a transformers Qwen3.5: Gated DeltaNet layers beside a full-attention layer) against transformers on
staged steps: requests prefilled in random chunks across page boundaries and decoded, with checkpoints at page
boundaries, a request resuming from a copy-on-write of another's checkpoint, and decode steps padded as a captured
graph runs them. Every logit, every working state and every checkpoint must be transformers' within the tolerance;
padded rows write only the padding state row; a wrong checkpoint is caught."""
import functools
import random
import re
import pytest
import torch
from tokenspeed_lit.core.device import default_device
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.staging.input_buffers import InputBuffers, RuntimeStates
from tokenspeed_lit.staging.step_plan import ForwardOp
from tokenspeed_lit.demo.models.hybrid import (PagedHybrid, TOLERANCE, checkpoint_at, run_hybrid_reference,
                                               state_shapes, tiny_qwen35)

DEV = default_device()
MODEL = tiny_qwen35(seed=5, device=DEV)
MAX_BS = 4


@functools.lru_cache(maxsize=None)
def _reference(seq: tuple, new_tokens: int):
    "transformers' reference for a sequence, once per module (read only: the tests compare with it)."
    return run_hybrid_reference(MODEL, list(seq), new_tokens)


class Engine:
    "The test's scheduler: requests with pages and a working state row, staged by fill_input_buffers, checked every step."
    def __init__(self, seqs, ps, new_tokens=4):
        c = MODEL.config
        self.ps, self.refs = ps, [_reference(tuple(s), new_tokens) for s in seqs]
        self.plen = [len(s) for s in seqs]
        self.pool = PagedKVPool(160, ps, c.num_hidden_layers, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                                dtype=torch.float32, device=DEV, **state_shapes(MODEL))
        self.bufs = InputBuffers(MAX_BS, 48, ps, dummy_kv_slot=0, state_write_padding_pool_index=0, device=DEV, has_mamba=True)
        self.rs = RuntimeStates(MAX_BS, c.vocab_size, 1, device=DEV)
        self.table = torch.full((MAX_BS + 1, 64 // ps + 1), -1, dtype=torch.int32, device=DEV); self.table[0] = 0
        self.model = PagedHybrid(MODEL, self.pool, self.bufs, self.table, 'pool')
        self.pages, self.work, self.cache, self.cow = {}, {}, {}, {}
        self.checkpoints, self.worst = {}, [0.0, 0.0]

    def admit(self, i, shared=(), cached=0, cow=-1):
        pages = list(shared) + self.pool.alloc(-(-len(self.refs[i].tokens) // self.ps) - len(shared))
        self.pages[i], self.work[i], self.cache[i], self.cow[i] = pages, self.pool.alloc(1)[0], cached, cow
        self.table[i + 1] = -1; self.table[i + 1, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.rs.valid_cache_lengths[i + 1] = cached

    def states(self, row):
        return [(c[row], s[row]) for c, s in self.pool.state_slabs]

    def diff(self, states, i, q):
        r = self.refs[i]
        return max(max((c - r.conv[j, q]).abs().max().item(), (s - r.ssm[j, q]).abs().max().item())
                   for j, (c, s) in enumerate(states))

    def step(self, rows, pad_to=None):
        pre = [(i, n) for i, n in rows if self.cache[i] < self.plen[i]]
        dec = [(i, n) for i, n in rows if self.cache[i] >= self.plen[i]]
        rows, tok = pre + dec, lambda i, a, b: self.refs[i].tokens[a:b]
        for i, _ in dec:
            self.rs.future_input_map[i + 1, 0] = self.refs[i].tokens[self.cache[i]]
            self.rs.remote_spec_candidate_ready[i + 1] = True
        marks = [checkpoint_at(self.cache[i], n, self.ps) for i, n in rows]
        op = ForwardOp(request_ids=[i for i, _ in rows], request_pool_indices=[i + 1 for i, _ in rows],
                       input_lengths=[n for _, n in rows],
                       input_ids=[t for i, n in pre for t in tok(i, self.cache[i], self.cache[i] + n)],
                       shifted_input_ids=[t for i, n in pre for t in tok(i, self.cache[i] + 1, self.cache[i] + n + 1)],
                       extend_prefix_lens=[self.cache[i] for i, _ in pre], prefill_lengths=[self.plen[i] for i, _ in pre],
                       decode_input_ids=[-1] * len(dec) if dec else None,
                       mamba_pool_indices=[self.work[i] for i, _ in rows],
                       mamba_cow_src_indices=[self.cow[i] for i, _ in rows], mamba_branching_seqlens=marks,
                       mamba_track_pool_indices=[self.pages[i][b // self.ps - 1] if b > 0 else -1
                                                 for (i, _), b in zip(rows, marks)])
        T = sum(n for _, n in rows)
        self.bufs.fill_input_buffers(op, self.rs, self.table, T, table_order='pool')
        logits, o = self.model.forward(T + (pad_to or len(rows)) - len(rows), pad_to or len(rows)), 0
        for (i, n), b in zip(rows, marks):
            d = (logits[o:o + n] - self.refs[i].logits[self.cache[i]:self.cache[i] + n]).abs().max().item()
            self.worst[0] = max(self.worst[0], d)
            o += n; self.cache[i] += n; self.cow[i] = -1
            self.rs.valid_cache_lengths[i + 1] = self.cache[i]
            self.worst[1] = max(self.worst[1], self.diff(self.states(self.work[i]), i, self.cache[i]))
            if b > 0:
                self.checkpoints[(i, b)] = self.pages[i][b // self.ps - 1]
                self.worst[1] = max(self.worst[1], self.diff(self.states(self.checkpoints[(i, b)]), i, b))


def run_to_end(e, ids, rnd, max_chunk):
    "Random chunks of prefill, then decode, in steps mixing whichever requests are live."
    while True:
        rows = [(i, min(rnd.randint(1, max_chunk), e.plen[i] - e.cache[i])) for i in ids if e.cache[i] < e.plen[i]]
        rows += [(i, 1) for i in ids if e.plen[i] <= e.cache[i] < len(e.refs[i].tokens) - 1]
        if not rows: return
        e.step(rows)


@pytest.mark.parametrize('seed,ps', [(0, 4), (1, 2), (2, 1), (3, 8)])
def test_chunked_prefill_decode_and_prefix_reuse_equal_transformers(seed, ps):
    rnd = random.Random(seed)
    shared = [rnd.randrange(2, 256) for _ in range(2 * max(ps, 4))]
    seqs = [shared + [rnd.randrange(2, 256) for _ in range(rnd.randint(1, 9))] for _ in range(2)]
    seqs.append([rnd.randrange(2, 256) for _ in range(rnd.randint(1, 20))])
    e = Engine(seqs, ps)
    e.admit(0); e.admit(2)
    run_to_end(e, [0, 2], rnd, 7)
    # request 1 shares request 0's first `cut` tokens: their pages, and a copy of the checkpoint at `cut`
    cut = max(b for (i, b) in e.checkpoints if i == 0 and b <= len(shared))
    row = e.checkpoints[(0, cut)]
    saved = [(c.clone(), s.clone()) for c, s in e.states(row)]
    e.admit(1, shared=e.pages[0][:cut // ps], cached=cut, cow=row)
    run_to_end(e, [1], rnd, 5)
    assert e.worst[0] <= TOLERANCE and e.worst[1] <= TOLERANCE, e.worst
    assert all(torch.equal(x, y) for p, q in zip(e.states(row), saved) for x, y in zip(p, q))   # never written


def test_padded_rows_write_only_the_padding_row():
    e = Engine([[5, 6, 7, 8, 9], [10, 11, 12]], 4)
    e.admit(0); e.admit(1)
    e.step([(0, 5), (1, 3)])
    before, marks = [(c.clone(), s.clone()) for c, s in e.pool.state_slabs], set(e.checkpoints.items())
    e.step([(0, 1), (1, 1)], pad_to=MAX_BS)
    tracked = [row for k, row in e.checkpoints.items() if (k, row) not in marks]   # request 1 reaches a page boundary
    changed = sorted({r for (c, s), (c0, s0) in zip(e.pool.state_slabs, before)
                      for r in range(e.pool.num_pages) if not (torch.equal(c[r], c0[r]) and torch.equal(s[r], s0[r]))})
    assert tracked and changed == sorted([0, e.work[0], e.work[1]] + tracked), changed
    assert max(e.worst) <= TOLERANCE, e.worst


@pytest.mark.parametrize('cow', ['wrong', 'none'])
def test_a_wrong_or_missing_checkpoint_is_caught(cow):
    a = [random.Random(7).randrange(2, 256) for _ in range(12)]
    e = Engine([a, a[:8] + [3, 4, 5]], 4)
    e.admit(0)
    e.step([(0, 5)]); e.step([(0, 5)])
    e.admit(1, shared=e.pages[0][:2], cached=8, cow=e.checkpoints[(0, 4)] if cow == 'wrong' else -1)
    e.step([(1, 3)])
    assert min(e.worst) > 5 * TOLERANCE, e.worst      # the decay and the conv window fade it: checked at once


def test_a_padded_tail_past_the_rows_stays_finite():
    "A padded decode graph at verify width 2 runs 2 tokens per row, a padded row has one: the tokens past every row's must not write NaN (or anything non-finite) to the dummy page every row's masked attention reads."
    e = Engine([[5, 6, 7, 8, 9], [10, 11, 12]], 4)
    e.admit(0); e.admit(1)
    e.step([(0, 5), (1, 3)])
    for t in e.pool.k_buffer + e.pool.v_buffer:
        if t is not None: t[:4] = 0                                          # the dummy page, clean
    e.step([(0, 1), (1, 1)], pad_to=MAX_BS)                                  # rows: 2 tokens + 2 padded of 1
    N = 2 * MAX_BS                                                           # what the width-2 graph runs
    logits = e.model.forward(N, MAX_BS)
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(t).all() for t in e.pool.k_buffer + e.pool.v_buffer if t is not None)
    assert max(e.worst) <= TOLERANCE, e.worst


# ---- refused state rows: every check runs before the step's first write ------------------------------------

def _two_requests():
    "Requests 0 and 1 prefilled 5 and 2 tokens (states in both working rows); the step staged next: 4 more tokens each."
    e = Engine([[(7 * i) % 250 + 2 for i in range(13)], [(11 * i) % 250 + 2 for i in range(9)]], 4)
    e.admit(0); e.admit(1)
    e.step([(0, 5), (1, 2)])
    t = lambda i: e.refs[i].tokens[e.cache[i]:e.cache[i] + 5]
    op = ForwardOp(request_ids=[0, 1], request_pool_indices=[1, 2], input_lengths=[4, 4], input_ids=t(0)[:4] + t(1)[:4],
                   shifted_input_ids=t(0)[1:] + t(1)[1:], extend_prefix_lens=[5, 2], prefill_lengths=e.plen,
                   mamba_pool_indices=[e.work[0], e.work[1]], mamba_cow_src_indices=[-1, -1],
                   mamba_branching_seqlens=[-1, -1], mamba_track_pool_indices=[-1, -1])
    e.bufs.fill_input_buffers(op, e.rs, e.table, 8, table_order='pool')     # rows 0, 1: lengths 6..9 and 3..6
    v = dict(w0=e.work[0], w1=e.work[1], p0=e.pages[0][1], p1=e.pages[1][0])   # p0, p1: the pages ending at 8 and 4
    return e, v


def _snapshot(e):
    return ([t.clone() for pair in e.pool.state_slabs for t in pair] +
            [t.clone() for t in e.pool.k_buffer + e.pool.v_buffer if t is not None])


def _lists(**kw):
    "Write Mamba lists (name -> values, rows 0.. ) straight into the buffers, as anything writing them could."
    def poke(e, v):
        for name, vals in kw.items():
            getattr(e.bufs, name + '_buf')[:len(vals)] = torch.tensor([v[x] if isinstance(x, str) else x for x in vals])
        return 8, 2
    return poke


def _padded(**kw):
    "The two rows padded to MAX_BS rows (a captured graph's), then `kw` (buffer -> {row: value}) written."
    def poke(e, v):
        for name, at in kw.items():
            for row, x in at.items(): getattr(e.bufs, name + '_buf')[row] = v[x] if isinstance(x, str) else x
        return 8 + MAX_BS - 2, MAX_BS
    return poke


def _other(f):
    def poke(e, v):
        return f(e, v) or (8, 2)
    return poke


REFUSED = {
    # (a) two live rows on one working row
    'shared working row': (_lists(mamba_pool_indices=['w0', 'w0']), "mamba_pool_indices[1] = {w0} is also row 0's working row"),
    # (b) negatives other than -1, in every list
    'working row -2': (_lists(mamba_pool_indices=['w0', -2]), 'mamba_pool_indices[1] = -2: the only negative is -1'),
    'cow source -2': (_lists(mamba_cow_src_indices=[-2, -1]), 'mamba_cow_src_indices[0] = -2: the only negative is -1'),
    'cow source -3': (_lists(mamba_cow_src_indices=[-1, -3]), 'mamba_cow_src_indices[1] = -3: the only negative is -1'),
    'checkpoint row -2': (_lists(mamba_track_pool_indices=[-2, -1], mamba_branching_seqlens=[8, -1]),
                          'mamba_track_pool_indices[0] = -2: the only negative is -1'),
    'checkpoint row -3': (_lists(mamba_track_pool_indices=[-1, -3], mamba_branching_seqlens=[-1, 4]),
                          'mamba_track_pool_indices[1] = -3: the only negative is -1'),
    'checkpoint length -2': (_lists(mamba_branching_seqlens=[-2, -1]), 'mamba_branching_seqlens[0] = -2'),
    'checkpoint length without a row': (_lists(mamba_branching_seqlens=[8, -1]),
                                        'mamba_track_pool_indices[0] = -1 with mamba_branching_seqlens[0] = 8'),
    'checkpoint row without a length': (_lists(mamba_track_pool_indices=['p0', -1]),
                                        'mamba_track_pool_indices[0] = {p0} with mamba_branching_seqlens[0] = -1'),
    # (c) a checkpoint row that is a working row (its own or another's), or another row's checkpoint row
    'checkpoint on its own working row': (_lists(mamba_track_pool_indices=['w0', -1], mamba_branching_seqlens=[8, -1]),
                                          'mamba_track_pool_indices[0] = {w0} is its own working row'),
    "checkpoint on another's working row": (_lists(mamba_track_pool_indices=[-1, 'w0'], mamba_branching_seqlens=[-1, 4]),
                                            "mamba_track_pool_indices[1] = {w0} is row 0's working row"),
    'two checkpoints on one row': (_lists(mamba_track_pool_indices=['p0', 'p0'], mamba_branching_seqlens=[8, 4]),
                                   "mamba_track_pool_indices[1] = {p0} is also row 0's checkpoint row"),
    # a copy-on-write source the step writes
    'cow from its own working row': (_lists(mamba_cow_src_indices=['w0', -1]), 'mamba_cow_src_indices[0] = {w0} is its own working row'),
    "cow from another's working row": (_lists(mamba_cow_src_indices=[-1, 'w0']), "mamba_cow_src_indices[1] = {w0} is row 0's working row"),
    "cow from a checkpoint of the step": (_lists(mamba_cow_src_indices=[-1, 'p0'], mamba_track_pool_indices=['p0', -1],
                                                 mamba_branching_seqlens=[8, -1]),
                                          "mamba_cow_src_indices[1] = {p0} is row 0's checkpoint row"),
    # the padding row, which padded rows overwrite, as a live row's row; a padded row that copies or checkpoints
    'working row on the padding row': (_lists(mamba_pool_indices=[0, 'w1']), 'mamba_pool_indices[0] = 0 is the padding state row'),
    'checkpoint on the padding row': (_lists(mamba_track_pool_indices=[0, -1], mamba_branching_seqlens=[8, -1]),
                                      'mamba_track_pool_indices[0] = 0 is the padding state row'),
    'cow from the padding row': (_lists(mamba_cow_src_indices=[0, -1]), 'mamba_cow_src_indices[0] = 0 is the padding state row'),
    'padded row with a cow source': (_padded(mamba_cow_src_indices={2: 'p0'}),
                                     'mamba_cow_src_indices[2] = {p0} on a padded row (mamba_pool_indices[2] = -1)'),
    'padded row with a checkpoint': (_padded(mamba_track_pool_indices={3: 'p1'}, mamba_branching_seqlens={3: 1}),
                                     'mamba_track_pool_indices[3] = {p1} on a padded row'),
    'live row without its lists': (_padded(state_write_req_pool_indices={3: 5}),
                                   'row 3 has no mamba_pool_index and is not a padded row'),
    # (d) past the state rows
    'working row past the pool': (_lists(mamba_pool_indices=['w0', 160]), 'mamba_pool_indices[1] = 160 is past the pool (160 state rows)'),
    'cow source past the pool': (_lists(mamba_cow_src_indices=[999, -1]), 'mamba_cow_src_indices[0] = 999 is past the pool'),
    'checkpoint past the pool': (_lists(mamba_track_pool_indices=[160, -1], mamba_branching_seqlens=[8, -1]),
                                 'mamba_track_pool_indices[0] = 160 is past the pool'),
    'checkpoint outside the step': (_lists(mamba_track_pool_indices=['p0', -1], mamba_branching_seqlens=[12, -1]),
                                    'row 0: its checkpoint at length 12 is not in this step (lengths 6..9)'),
    # what else the step reads before its layers: its rows' tokens, lengths and KV slots
    'more tokens than the step': (_other(lambda e, v: (7, 2)), 'the 2 rows hold 8 tokens (input_lengths), more than num_tokens = 7'),
    'a length short of its tokens': (_other(lambda e, v: e.bufs.seq_lens_buf.__setitem__(1, 3)),
                                     'row 1: input_lengths[1] = 4 with seq_lens[1] = 3'),
    'a negative KV slot': (_other(lambda e, v: e.bufs.out_cache_loc_buf.__setitem__(5, -1)),
                           'out_cache_loc[5] = -1 is not a KV slot of the pool (0..639)'),
    'a page past the pool': (_other(lambda e, v: e.table.__setitem__((2, 0), 500)),
                             'the page table row of token 4 names page 500, past the pool (160 pages)'),
}


@pytest.mark.parametrize('kind', REFUSED)
def test_a_bad_state_row_is_refused_before_any_write(kind):
    e, v = _two_requests()
    poke, msg = REFUSED[kind]
    N, B = poke(e, v)
    before = _snapshot(e)
    with pytest.raises(ValueError, match=re.escape(msg.format(**v))):
        e.model.forward(N, B)
    assert all(torch.equal(x, y) for x, y in zip(before, _snapshot(e))), 'a refused step wrote'


def test_distinct_rows_run_and_equal_transformers():
    "The control of the refusals above: the same step, its rows distinct, runs; states and checkpoints are the reference's."
    e, v = _two_requests()
    _lists(mamba_track_pool_indices=['p0', 'p1'], mamba_branching_seqlens=[8, 4])(e, v)
    e.model.forward(8, 2)
    assert max(e.diff(e.states(v['w0']), 0, 9), e.diff(e.states(v['w1']), 1, 6),
               e.diff(e.states(v['p0']), 0, 8), e.diff(e.states(v['p1']), 1, 4)) <= TOLERANCE


# ---- every layer's tensors, at binding and before a step writes ---------------------------------------------

def _replace_slab(layer, kind, make):
    "Replace state layer `layer`'s conv (kind 0) or recurrent (1) slab by `make(pool, old)`."
    def f(pool):
        i = pool.state_layers.index(layer)
        pair = list(pool.state_slabs[i]); pair[kind] = make(pool, pair[kind]); pool.state_slabs[i] = tuple(pair)
    return f


def _kv_of(pool, layer, t):
    pool.k_buffer[layer] = t


BAD_TENSORS = {
    'a later layer of the wrong shape': (_replace_slab(2, 1, lambda p, t: t[:, :2].clone()),
                                         'layer 2: pool state rows are conv [128, 4], recurrent [2, 16, 16]', ValueError),
    'a later layer of the wrong dtype': (_replace_slab(2, 0, lambda p, t: t.double()),
                                         'layer 2: conv holds torch.float64, the model computes in torch.float32', TypeError),
    'a later layer short of rows': (_replace_slab(1, 1, lambda p, t: t[:8].clone()),
                                    'layer 1: its recurrent slab has 8 state rows, the pool 160 page ids', ValueError),
    'a later layer on another device': (_replace_slab(2, 1, lambda p, t: torch.empty_like(t, device='meta')),
                                        'layer 2: its recurrent slab is on meta', ValueError),
    'a later layer not contiguous': (_replace_slab(1, 0, lambda p, t: t.transpose(1, 2).contiguous().transpose(1, 2)),
                                     'layer 1: its conv slab is not contiguous', ValueError),
    'two layers on one slab': (lambda pool: pool.state_slabs.__setitem__(2, pool.state_slabs[0]),
                               'slab of layer 2 share memory', ValueError),
    'a slab inside another': (_replace_slab(1, 0, lambda p, t: p.state_slabs[0][0].view(-1)[:t.numel()].view(t.shape)),
                              'the conv slab of layer 0 and the conv slab of layer 1 share memory', ValueError),
    'a K tensor inside a slab': (lambda pool: _kv_of(pool, 3, pool.state_slabs[0][0].view(-1)[:pool.k_buffer[3].numel()]
                                                     .view(pool.k_buffer[3].shape)), 'share memory', ValueError),
    'a K tensor of the wrong dtype': (lambda pool: _kv_of(pool, 3, pool.k_buffer[3].double()),
                                      'layer 3: K holds torch.float64', TypeError),
}


@pytest.mark.parametrize('when', ['binding', 'forward'])
@pytest.mark.parametrize('kind', BAD_TENSORS)
def test_every_layers_tensors_are_checked_before_any_write(kind, when):
    spoil, msg, exc = BAD_TENSORS[kind]
    e, v = _two_requests()
    tensors = [t for pair in e.pool.state_slabs for t in pair] + [t for t in e.pool.k_buffer + e.pool.v_buffer if t is not None]
    before = [t.clone() for t in tensors]               # the pool's own tensors (a replacement may be a view of one)
    spoil(e.pool)
    with pytest.raises(exc, match=re.escape(msg)):
        if when == 'binding': PagedHybrid(MODEL, e.pool, e.bufs, e.table, 'pool')
        else: e.model.forward(8, 2)                      # bound before the tensor was replaced
    assert all(torch.equal(t, b) for t, b in zip(tensors, before)), 'a refused step wrote'


@pytest.mark.parametrize('field,value,msg', [
    ('state_write_padding_pool_index', 160, 'state_write_padding_pool_index = 160 is not a state row of the pool (0..159)'),
    ('dummy_kv_slot', 640, 'dummy_kv_slot = 640 is not a KV slot of the pool (0..639)')])
def test_padding_values_outside_the_pool_are_refused_at_binding(field, value, msg):
    e = Engine([[5, 6, 7]], 4)
    before = _snapshot(e)
    bufs = InputBuffers(MAX_BS, 48, 4, **{'dummy_kv_slot': 0, 'state_write_padding_pool_index': 0, field: value},
                        device=DEV, has_mamba=True)
    with pytest.raises(ValueError, match=re.escape(msg)):
        PagedHybrid(MODEL, e.pool, bufs, e.table, 'pool')
    assert all(torch.equal(x, y) for x, y in zip(before, _snapshot(e)))
