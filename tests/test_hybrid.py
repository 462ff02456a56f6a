"""PagedHybrid (a transformers Qwen3.5: Gated DeltaNet layers beside a full-attention layer) against transformers on
staged steps: requests prefilled in random chunks across page boundaries and decoded, with checkpoints at page
boundaries, a request resuming from a copy-on-write of another's checkpoint, and decode steps padded as a captured
graph runs them. Every logit, every working state and every checkpoint must be transformers' within the tolerance;
padded rows write only the padding state row; a wrong checkpoint is caught."""
import random
import pytest
import torch
from tokenspeed_lit.device import default_device
from tokenspeed_lit.kv_pool import PagedKVPool
from tokenspeed_lit.input_buffers import InputBuffers, ForwardOp, RuntimeStates
from tokenspeed_lit.hybrid import PagedHybrid, TOLERANCE, checkpoint_at, run_hybrid_reference, state_shapes, tiny_qwen35

DEV = default_device()
MODEL = tiny_qwen35(seed=5, device=DEV)
MAX_BS = 4


class Engine:
    "The test's scheduler: requests with pages and a working state row, staged by fill_input_buffers, checked every step."
    def __init__(self, seqs, ps, new_tokens=4):
        c = MODEL.config
        self.ps, self.refs = ps, [run_hybrid_reference(MODEL, s, new_tokens) for s in seqs]
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
