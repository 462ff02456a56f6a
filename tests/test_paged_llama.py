"""PagedLlama against transformers on random steps: prefill chunks over a cached history and decode rows with a verify
width, staged by the real fill_input_buffers from pool- or batch-ordered tables over shuffled pages; decode-only steps
also padded as a captured graph would run them. Logits of every token, and K and V of every cached position, must be
transformers' within the tolerance, and a padded forward writes nothing but the step's slots and the dummy page."""
import subprocess, sys
import torch
from hypothesis import given, settings, strategies as st
from tokenspeed_lit.core.device import default_device
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.staging.input_buffers import InputBuffers, RuntimeStates
from tokenspeed_lit.staging.step_plan import ForwardOp
from tokenspeed_lit.demo.models.llama import PagedLlama, TOLERANCE, tiny_llama

DEV = default_device()
VOCAB, MAX_LEN, MAX_BS, MAX_TOKENS = 500, 20, 6, 48
LLAMA = tiny_llama(vocab=VOCAB, layers=2, heads=4, kv_heads=1, head_dim=8, intermediate=32, seed=3, device=DEV)


def truth(tokens):
    "transformers' logits [len, vocab] and keys, values [layers, len, kv_heads, head_dim] of one sequence."
    with torch.no_grad():
        out = LLAMA(torch.tensor([tokens], device=DEV), use_cache=True)
    kv = lambda name: torch.stack([getattr(l, name)[0].transpose(0, 1) for l in out.past_key_values.layers])
    return out.logits[0], kv('keys'), kv('values')


@st.composite
def steps(draw):
    ps = draw(st.sampled_from([1, 2, 4, 8]))
    L = draw(st.integers(1, 3))
    n_pre, n_dec = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    if n_pre + n_dec == 0: n_dec = 1
    rows = []
    for i in range(n_pre + n_dec):
        length = draw(st.integers(L + 1, MAX_LEN))
        tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=length, max_size=length))
        if i < n_pre:
            cached = draw(st.integers(0, length - 1))
            rows.append((tokens, cached, draw(st.integers(1, min(length - cached, 8))), True))
        else:
            rows.append((tokens, draw(st.integers(0, length - L)), L, False))
    extra = draw(st.integers(0, MAX_BS - len(rows))) if n_pre == 0 else 0   # padded rows of a decode graph
    return ps, L, rows, extra, draw(st.sampled_from(['pool', 'batch'])), draw(st.randoms(use_true_random=False))


@settings(max_examples=25)
@given(steps())
def test_paged_forward_is_transformers(step):
    ps, L, rows, extra, order, rnd = step
    width = -(-MAX_LEN // ps) + 1
    pool = PagedKVPool(len(rows) * width + 2, ps, 2, num_kv_heads=1, head_dim=8, dtype=torch.float32, device=DEV)
    for t in pool.k_buffer + pool.v_buffer: t.fill_(-1.0)
    bufs = InputBuffers(MAX_BS, MAX_TOKENS, ps, dummy_kv_slot=0, state_write_padding_pool_index=0, device=DEV)
    states = RuntimeStates(MAX_BS, VOCAB, output_length=L, device=DEV)
    free = pool.alloc(pool.num_free); rnd.shuffle(free)
    pools = rnd.sample(range(1, MAX_BS + 1), len(rows))            # pool rows, in no order
    table = torch.full((MAX_BS + 1 if order == 'pool' else MAX_BS, width), -1, dtype=torch.int32, device=DEV)
    table[0] = 0
    pages, refs = [], []
    for i, (tokens, cached, n, pre) in enumerate(rows):
        need = -(-(cached + n) // ps)
        pages.append([free.pop() for _ in range(need)])
        table[pools[i] if order == 'pool' else i, :need] = torch.tensor(pages[-1], dtype=torch.int32)
        refs.append(truth(tokens[:cached + n]))
        slots = torch.tensor([pages[i][q // ps] * ps + q % ps for q in range(cached)], dtype=torch.long, device=DEV)
        for l in range(2):                                             # the history, as an earlier step left it
            pool.k_of(l)[slots] = refs[-1][1][l, :cached]; pool.v_of(l)[slots] = refs[-1][2][l, :cached]
        states.valid_cache_lengths[pools[i]] = cached
        if not pre:
            states.future_input_map[pools[i]] = torch.tensor(tokens[cached:cached + L], dtype=torch.int32)
            states.remote_spec_candidate_ready[pools[i]] = True
    pre = [r for r in rows if r[3]]
    op = ForwardOp(request_ids=list(range(len(rows))), request_pool_indices=pools, input_lengths=[r[2] for r in rows],
                   input_ids=[t for tokens, c, n, _ in pre for t in tokens[c:c + n]],
                   shifted_input_ids=[t for tokens, c, n, _ in pre for t in tokens[c + 1:c + n + 1] + [1] * (c + n + 1 - len(tokens))],
                   extend_prefix_lens=[r[1] for r in pre], prefill_lengths=[len(r[0]) for r in pre],
                   decode_input_ids=[-1] * (len(rows) - len(pre)) if len(pre) < len(rows) else None)
    total = sum(r[2] for r in rows)
    bufs.fill_input_buffers(op, states, table, total, table_order=order)
    if order == 'batch': table[len(rows):] = 0                          # rows past the batch: the dummy page
    model = PagedLlama(LLAMA, pool, bufs, table, table_order=order)
    before = [t.clone() for t in pool.k_buffer + pool.v_buffer]
    if extra: model.forward((len(rows) + extra) * L, len(rows) + extra)   # a padded decode graph's forward
    else: model.forward(total, len(rows))
    got, off = model.logits[:total], 0
    step_slots = set()
    for i, (tokens, cached, n, _) in enumerate(rows):
        logits, keys, values = refs[i]
        assert (got[off:off + n] - logits[cached:]).abs().max().item() <= TOLERANCE, (i, 'logits')
        slots = torch.tensor([pages[i][q // ps] * ps + q % ps for q in range(cached + n)], dtype=torch.long, device=DEV)
        step_slots |= set(slots[cached:].tolist())
        for l in range(2):
            assert (pool.k_of(l)[slots] - keys[l]).abs().max().item() <= TOLERANCE, (i, l, 'K')
            assert (pool.v_of(l)[slots] - values[l]).abs().max().item() <= TOLERANCE, (i, l, 'V')
        off += n
    for t, b in zip(pool.k_buffer + pool.v_buffer, before):
        changed = set((t != b).flatten(1).any(1).nonzero().flatten().tolist())
        assert changed <= step_slots | set(range(ps)), sorted(changed - step_slots)   # the step's slots, the dummy page


def test_the_package_imports_without_transformers():
    code = ("import sys; sys.modules['transformers'] = None\n"      # any import of transformers now fails
            "import tokenspeed_lit.demo.models.llama, tokenspeed_lit.demo.cli\n"
            "assert not [m for m in sys.modules if m == 'bench' or m.startswith('bench.')], 'the demo imports benchmark code'")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
