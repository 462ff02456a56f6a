"""The staging ring (`tokenspeed_lit.staging_ring`): the header declared once and read by name (the kernels' reads tied
to the declaration), the copy that moves exactly a slot's staged ints, the rule of when a slot is free (done flags and
tickets), the capture slot's rules (a replay with nothing new staged runs no step, from construction on, and is
counted; a refused restaging leaves nothing staged), leases of slots (foreign, stale and rebound slots refused), and
every public ring method refusing host input that would write outside the declared buffers."""
import ast, inspect, re
from pathlib import Path
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tokenspeed_lit import staging_ring as sr, fused_decode as fd
from tokenspeed_lit.device import host_full
from tokenspeed_lit.graphs import capture
from tokenspeed_lit.streams import synchronize
from tokenspeed_lit.staging_ring import STEP_HEADER, HDR, StagingRing, StagingSlot, copy_slot, CAPTURE, staging_layout
from tokenspeed_lit.fused_decode import FusedDecodeStep

from conftest import DEV, random_table
POISON = -77
PKG = Path(sr.__file__).parent


def _step(seed=0, max_bs=4, max_tok=8, W=2, pool_rows=10, vocab=40):
    "A bound step of `max_bs` rows over a random state: (step, [cache lengths, input map, ready, table])."
    g = torch.Generator().manual_seed(seed)
    vcl = torch.randint(0, 10, (pool_rows,), generator=g, dtype=torch.int32)
    fim = torch.randint(0, vocab, (pool_rows, W), generator=g, dtype=torch.int32)
    ready = torch.rand(pool_rows, generator=g) < 0.5
    table = random_table(g, pool_rows, 4)
    state = [t.to(DEV) for t in (vcl, fim, ready, table)]
    step = FusedDecodeStep.create(max_bs, max_tok, 4, dummy_kv_slot=1, state_write_padding_pool_index=pool_rows, device=DEV)
    return step.bind(state[0], state[1], state[2], vocab, state[3]), state


# ---- the header, declared once ------------------------------------------------------------------------------------

def _jit_sources():
    "The source of every Triton kernel and helper of the staging ring and the fused step."
    out = {}
    for mod in (sr, fd):
        for name, obj in vars(mod).items():
            fn = getattr(obj, 'fn', None)
            if fn is not None and getattr(fn, '__module__', None) == mod.__name__: out[name] = inspect.getsource(fn)
    return out


def test_the_kernels_read_only_declared_fields_by_name():
    "Every header read in a kernel is `HDR.<declared field>`; no kernel reads a header field by a literal offset."
    srcs = _jit_sources()
    assert {'_copy_kernel', '_fill_kernel', '_request_rows', '_mamba_rows', '_decode_rows', '_token_tiles'} <= set(srcs)
    read = set()
    for name, src in srcs.items():
        fields = set(re.findall(r'\bHDR\.(\w+)', src))
        assert fields <= set(STEP_HEADER.names), (name, fields - set(STEP_HEADER.names))
        read |= fields
        assert not re.search(r'tl\.load\(\s*s32\s*\+\s*\d', src), f'{name} reads the header at a literal offset'
    # every per-step and bound field is read by some kernel: a declared field the kernels ignore is a mistake
    want = set(STEP_HEADER.groups['step']) | set(STEP_HEADER.groups['ring']) | set(STEP_HEADER.groups['bound'])
    unread = want - read - {f'o_mamba{k}' for k in (1, 2, 3)}     # read as o_mamba0 + k
    assert not unread, f'declared but read by no kernel: {sorted(unread)}'


def test_no_header_field_is_written_by_a_literal_index():
    "The host writes header fields only through the declaration's writers: no `m[<int>] = ...` where steps are staged."
    bad = []
    for p in (PKG / 'staging_ring.py', PKG / 'fused_decode.py', PKG / 'input_buffers.py'):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                            and isinstance(t.slice.value, int) and not isinstance(t.value, ast.Attribute)):
                        bad.append(f'{p.name}:{node.lineno}')
    assert not bad, f'writes by a literal index: {bad}'


@given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=len(STEP_HEADER.names), max_size=len(STEP_HEADER.names)))
def test_the_writer_stores_each_field_at_its_declared_offset(values):
    m = np.full(STEP_HEADER.size, POISON, np.int32)
    STEP_HEADER.writer(STEP_HEADER.names)(memoryview(m), *values)
    assert m[:len(values)].tolist() == values and (m[len(values):] == POISON).all()
    assert [getattr(HDR, n) for n in STEP_HEADER.names] == list(range(len(values)))


def test_a_field_declared_twice_or_too_many_are_refused():
    with pytest.raises(ValueError, match='declared twice'): sr.HeaderLayout(8, a=('x', 'y'), b=('x',))
    with pytest.raises(ValueError, match='do not fit 2 ints'): sr.HeaderLayout(2, a=('x', 'y', 'z'))


# ---- the copy ------------------------------------------------------------------------------------------------------

@given(n=st.integers(0, 9000) | st.sampled_from([0, STEP_HEADER.size - 1, STEP_HEADER.size, 1024, 4097, 8999, 9000, 9001,
                                                 2**31 - 1, -5]),
       seed=st.integers(0, 2**31 - 1))
def test_the_copy_moves_exactly_the_staged_ints(n, seed):
    "At least the header, at most the slot: a staged count is a device-side value, any one is safe."
    src = host_full((9000,), 0, torch.int32)
    src.copy_(torch.randint(-2**31, 2**31 - 1, (9000,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32))
    src[STEP_HEADER.at['staged']] = n
    dst = torch.full((9100,), POISON, dtype=torch.int32, device=DEV)
    copy_slot(dst, src)
    synchronize(DEV)
    m = min(max(n, STEP_HEADER.size), 9000)
    assert torch.equal(dst[:m].cpu(), src[:m])
    assert (dst[m:] == POISON).all(), 'copied past the staged count or past the slot'


# ---- the ring slots ------------------------------------------------------------------------------------------------

def test_ring_slots_alternate_and_the_capture_slot_is_apart():
    step, _ = _step()
    ring = step.ring
    capture(step.issue_captured, DEV)                      # (the capture slot is claimed for an engine's graph)
    got = []
    for _ in range(4):
        s = ring.take(); got.append(s); ring.commit(s, 0, 0, 0, 0, 0, False, False); ring.launch(s)
    assert got == [0, 1, 0, 1] and ring.claim() == CAPTURE


@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(['lists', 'staged', 'named'])), min_size=1, max_size=8),
       st.integers(0, 2**31 - 1))
def test_done_flags_show_each_launched_ticket(steps, seed):
    "After every step its ring slot's done flag holds the ticket that step committed; tickets never repeat."
    step, state = _step(seed, W=1)
    ring, seen = step.ring, set()
    for batch, way in steps:
        pools = list(range(1, batch + 1))
        if way == 'staged':
            sl = step.decode_slot(); sl.put(pools); step.issue_staged_decode(sl, batch, 1)
        elif way == 'lists': assert ring.stage(ring.take(), pools, None, [], [], (), (), 0, 1, batch)
        else: step(pools, 1)
        synchronize(DEV)
        s = max((0, 1), key=lambda i: ring.tickets[i])     # the slot of the latest step
        t = ring.tickets[s]
        assert t not in seen and int(ring.done_flags[s]) == t
        seen.add(t)


def test_a_copy_that_never_runs_is_an_error_not_a_hang():
    "A slot whose launched copy never reports is refused after the wait's timeout, naming the slot and its ticket."
    step, _ = _step(W=1)
    ring = step.ring
    s = ring.take(); ring.commit(s, 0, 0, 0, 0, 0, False, False)
    ring.done_flags[s] = -5                                # as if the launch below were lost before its copy ran
    ring.launch(s); synchronize(DEV)
    ring.done_flags[s] = -5
    ring.take()                                            # the other slot
    with pytest.raises(RuntimeError, match=f'host slot {s}: its step \\(ticket {ring.tickets[s]}\\) was launched but its '
                                           f'copy never ran'):
        ring._wait(s, timeout=0.05)
    ring.done_flags[s] = ring.tickets[s]                   # put it back: the ring works on
    step([1, 2], 1); synchronize(DEV)


def test_tickets_restart_before_they_leave_int32():
    step, _ = _step()
    ring = step.ring
    ring._ticket = 0x7fffffff - 1
    step.dummy(1, 1); step.dummy(1, 1)               # the last ticket, then a restart: the flags count from 1 again
    synchronize(DEV)
    assert max(ring.tickets) == 1 and int(ring.done_flags[:3].max()) == 1


def test_the_fast_stage_writes_what_pack_and_commit_write():
    "`stage` (lists back to back, its own commit and launch) against the named way (sections, commit, launch): same buffers and state."
    out = []
    for fast in (True, False):
        step, state = _step(3, max_bs=4, max_tok=12)
        ring = step.ring
        s = ring.take()
        pools, ovr, lens, prefix = [4, 7, 2], [9], [3, 2], [0, 1]
        ids, shifted = [11, 12, 13, 14, 15], [12, 13, 14, 15, 16]
        if fast: assert ring.stage(s, pools, ovr, lens, prefix, ids, shifted, 5, 2, 7)
        else:
            ring.pack(s, 'pool', pools, 'p'); ring.pack(s, 'override', ovr, 'o'); ring.pack(s, 'lengths', lens, 'l')
            ring.pack(s, 'extend_prefix', prefix, 'e'); ring.pack(s, 'ids', ids, 'i'); ring.pack(s, 'ids', shifted, 's', row=5)
            ring.commit(s, 3, 2, 5, 2, 7, True, False); ring.launch(s, True)
        synchronize(DEV)
        out.append(({k: v.cpu() for k, v in step.buffers.buffers().items()}, [t.cpu() for t in state]))
    for k in out[0][0]: assert torch.equal(out[0][0][k], out[1][0][k]), k
    for a, b in zip(out[0][1], out[1][1]): assert torch.equal(a, b)


# ---- the capture slot ------------------------------------------------------------------------------------------------

def _poisoned_state(step, state):
    step.buffers.poison_(POISON)
    return [t.clone() for t in state[:3]]


def _ran_no_step(step, state, before):
    "The replay left the runtime state alone and wrote padding everywhere (no step)."
    for t, b in zip(state[:3], before): assert torch.equal(t, b)
    v = step.buffers.values
    for name, t in step.buffers.buffers().items():
        if name != 'mrope_positions_buf': assert (t == v[name]).all(), name


@pytest.mark.parametrize('before', ['construction', 'bind', 'ring step', 'dummy', 'replayed step', 'refused restage'])
def test_a_replay_with_nothing_new_staged_runs_no_step(before):
    "Whatever came before, an engine-graph replay with no new step staged for it touches no state, writes padding and is counted."
    step, state = _step(5)
    graph = capture(step.issue_captured, DEV)
    if before == 'construction':
        step = FusedDecodeStep.create(4, 8, 4, dummy_kv_slot=1, state_write_padding_pool_index=10, device=DEV)
        graph = capture(step.issue_captured, DEV)
        step.bind(*state[:3], 40, state[3]); graph = capture(step.issue_captured, DEV)
    elif before == 'bind': step.bind(*state[:3], 40, state[3].clone()); graph = capture(step.issue_captured, DEV)
    elif before == 'ring step': step([3, 4], 2, [7, -1])
    elif before == 'dummy': step.dummy(2, 4)
    elif before == 'replayed step': step([3, 4], 2, [7, -1], captured=True); graph.replay()
    elif before == 'refused restage':
        step([3, 4], 2, [7, -1], captured=True)                      # staged, never replayed
        with pytest.raises(ValueError, match='decode_input_ids must hold int32'):
            step([5, 6], 2, [8, 2**31], captured=True)                  # refused after the pool indices were written
    synchronize(DEV)
    idle = step.ring.idle_replays
    mem = _poisoned_state(step, state)
    graph.replay(); synchronize(DEV)
    _ran_no_step(step, state, mem)
    assert step.ring.idle_replays == idle + 1
    with pytest.raises(RuntimeError, match='replayed the capture slot 1 time'): step.ring.claim()
    step([3], 2, captured=True); graph.replay(); synchronize(DEV)    # reported once: serving goes on
    assert step.buffers.req_pool_indices_buf.tolist()[:2] == [3, 0]


def test_a_replay_runs_a_staged_step_once():
    "The second replay of the same staged step leaves the overrides applied once."
    step, state = _step(3)
    graph = capture(step.issue_captured, DEV)
    assert step([3, 4], 2, [7, -1], captured=True) == [7, -1]
    graph.replay(); synchronize(DEV)
    mem = _poisoned_state(step, state)
    graph.replay(); synchronize(DEV)
    _ran_no_step(step, state, mem)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='a CPU capture is the function itself: it holds no arguments')
def test_staging_for_a_graph_older_than_the_binding_is_refused():
    step, (vcl, fim, ready, table) = _step(4)
    step.issue_captured()                                 # outside a capture on a GPU: nothing, not even a record
    with pytest.raises(ValueError, match='none was captured since the last bind'): step([1], 1, captured=True)
    capture(step.issue_captured, DEV)
    step([1], 1, captured=True)                           # accepted now
    step.bind(vcl, fim, ready, 40, table.clone())        # a new table: the graph holds the old one
    with pytest.raises(ValueError, match='capture the graph again'): step([1], 1, captured=True)
    with pytest.raises(ValueError, match='capture the graph again'): step.decode_slot(captured=True)


# ---- leases ----------------------------------------------------------------------------------------------------------

def _foreign(step):
    other, _ = _step(9)
    return other.decode_slot()

_BAD_LEASES = [   # (how the slot goes wrong, what the refusal names)
    ('another InputBuffers', lambda st: _foreign(st), 'handed out by another InputBuffers'),
    ('issued twice', lambda st: (lambda sl: (sl.put([1]), st.issue_staged_decode(sl, 1, 1), sl)[-1])(st.decode_slot()),
     'is stale'),
    ('ring took a slot since', lambda st: (lambda sl: (st([2], 1), sl)[-1])(st.decode_slot()), 'is stale'),
    ('a later decode_slot', lambda st: (lambda sl: (st.decode_slot(), sl)[-1])(st.decode_slot()), 'is stale'),
    ('captured, then a list step', lambda st: (lambda sl: (st([2], 1), sl)[-1])(st.decode_slot(captured=True)), 'is stale'),
    ('ring slot, then a captured step', lambda st: (lambda sl: (st([2], 1, captured=True), sl)[-1])(st.decode_slot()),
     'is stale'),
    ('after a dummy step', lambda st: (lambda sl: (st.dummy(1, 1), sl)[-1])(st.decode_slot()), 'is stale'),
    ('not a slot', lambda st: np.zeros(4, np.int32), 'must be the StagingSlot of the latest decode_slot()'),
]


@pytest.mark.parametrize('case, make, msg', _BAD_LEASES, ids=[c[0] for c in _BAD_LEASES])
def test_a_slot_that_is_not_what_it_seems_is_refused(case, make, msg):
    step, state = _step(1)
    graph = capture(step.issue_captured, DEV)              # (captured steps need the engine's graph captured)
    step([1, 2], 1); synchronize(DEV)
    sl = make(step)
    synchronize(DEV)
    snap, mem = step.buffers.snapshot(), [t.clone() for t in state[:3]]
    with pytest.raises(ValueError, match=re.escape(msg)): step.issue_staged_decode(sl, 1, 1)
    synchronize(DEV)
    for k, v in step.buffers.buffers().items(): assert torch.equal(v, snap[k]), k
    for t, b in zip(state[:3], mem): assert torch.equal(t, b)


@pytest.mark.parametrize('attr', ['req_pool_indices', 'decode_input_ids', 'mamba', 'slot', 'ring'])
def test_a_slot_cannot_be_rebound(attr):
    step, _ = _step()
    sl = step.decode_slot()
    with pytest.raises(AttributeError, match=f'StagingSlot.{attr} is a view of pinned staging'):
        setattr(sl, attr, np.array([3, 4], np.int32))
    sl.req_pool_indices[:2] = [3, 4]                        # writing into the view is the way
    step.issue_staged_decode(sl, 2, 1); synchronize(DEV)
    assert step.buffers.req_pool_indices_buf.tolist()[:3] == [3, 4, 0]


@pytest.mark.parametrize('args, msg', [
    (([1, 2, 3], [5]), 'decode_input_ids has 1 entries for 3 rows'),
    (([1, 2], [5, 6, 7]), 'decode_input_ids has 3 entries for 2 rows'),
    (([1], []), 'decode_input_ids has 0 entries for 1 rows'),
    ((list(range(5)),), 'req_pool_indices has 5 entries, the slot holds max_bs=4'),
    ((list(range(5)), [0] * 5), 'req_pool_indices has 5 entries, the slot holds max_bs=4'),
    (([1, 2**31],), 'req_pool_indices must hold int32 integers'),
    (([1, 2], [3, 2**31]), 'decode_input_ids must hold int32 integers'),
    (([1.5],), 'req_pool_indices must hold int32 integers'),
])
def test_put_refuses_lists_that_do_not_match(args, msg):
    step, _ = _step()
    sl = step.decode_slot()
    sl.put([1, 2], [3, 4])                                 # both lists of a size: the one-pack format exists too
    with pytest.raises(ValueError, match=re.escape(msg)): sl.put(*args)


@given(st.lists(st.tuples(st.integers(0, 4), st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_put_writes_what_the_views_hold(puts):
    "StagingSlot.put writes the rows the views then hold, the first time for a size (a pack per list) and after (one pack)."
    step, _ = _step(5)
    for n, with_overrides, bad in puts:
        sl = step.decode_slot()
        pools, ovr = list(range(1, n + 1)), ([-1, 7, 3, 9][:n] if with_overrides else None)
        if bad and n:
            name = 'decode_input_ids' if with_overrides else 'req_pool_indices'
            args = (pools, ovr[:-1] + [2**31]) if with_overrides else (pools[:-1] + [-2**31 - 1], ovr)
            with pytest.raises(ValueError, match=f'{name} must hold int32 integers'): sl.put(*args)
        assert sl.put(pools, ovr) == n
        assert sl.req_pool_indices[:n].tolist() == pools
        if with_overrides: assert sl.decode_input_ids[:n].tolist() == ovr
        if n: step.issue_staged_decode(sl, n, 1, overrides=with_overrides)
    synchronize(DEV)


def _pools_error_ref(rows, num_pool, name='req_pool_indices'):
    "The message check_pools must raise for `rows`, or None: the first value out of range, else the first pair."
    bad = [r for r in rows if not 0 <= r < num_pool]
    if bad: return f'{name} holds {bad[0]}, outside the pool [0, {num_pool})'
    for j, r in enumerate(rows):
        if r in rows[:j]: return f'{name} holds pool row {r} twice (requests {rows.index(r)} and {j})'
    return None


_RINGS = {}

@given(batch=st.integers(0, 300) | st.sampled_from([1, sr._BUILTIN_ROWS, sr._BUILTIN_ROWS + 1]),
       num_pool=st.sampled_from([1, 7, 300, 600]), kind=st.sampled_from(['ok', 'dup', 'neg', 'high', 'int32 edge']),
       data=st.data())
def test_check_pools_on_both_paths(batch, num_pool, kind, data):
    "Both ways check_pools checks (builtins up to _BUILTIN_ROWS rows, numpy above) refuse what the reference refuses."
    batch = min(batch, num_pool) if kind == 'ok' else max(batch, 2 if kind == 'dup' else 1)
    rows = data.draw(st.permutations(range(num_pool)))[:batch] if kind == 'ok' else \
        data.draw(st.lists(st.integers(0, num_pool - 1), min_size=batch, max_size=batch))
    if kind != 'ok' and rows:
        at = data.draw(st.integers(0, len(rows) - 1))
        rows[at] = {'dup': rows[at - 1] if at else rows[-1], 'neg': -data.draw(st.integers(1, 2**31)),
                    'high': data.draw(st.integers(num_pool, 2**31 - 1)), 'int32 edge': 2**31 - 1}[kind]
    if num_pool not in _RINGS:          # a step bound to a pool of num_pool rows, made once per size
        z = torch.zeros(num_pool, dtype=torch.int32, device=DEV)
        _RINGS[num_pool] = FusedDecodeStep.create(302, 302, 4, device=DEV).bind(
            z, z.view(-1, 1), z.bool(), 10, torch.ones(num_pool, 1, dtype=torch.int32, device=DEV))
    step = _RINGS[num_pool]
    sl = step.decode_slot()
    sl.req_pool_indices[:len(rows)] = np.array(rows, dtype=np.int64).astype(np.int32)
    want = _pools_error_ref(rows, num_pool)
    if want is None: step.ring.check_pools(sl.slot, len(rows))
    else:
        with pytest.raises(ValueError, match=re.escape(want)): step.ring.check_pools(sl.slot, len(rows))


# ---- every public ring method: host input that would write outside the buffers is refused --------------------------

def _stage(ring, B=1, E=0, P=0, W=1, T=None, ovr=None):
    s = ring.take()
    pools = list(range(1, B + 1))
    return ring.stage(s, pools, ovr, [1] * E, [0] * E, [1] * P, [1] * P, P, W, (B - E) * W + P if T is None else T)

_BAD_RING = [   # (call on a bound step of max_bs=4, max_num_tokens=8, width 2; what the refusal names)
    (lambda st: _stage(st.ring, B=40), 'a step of 40 requests'),
    (lambda st: _stage(st.ring, B=5), 'a step of 5 requests'),
    (lambda st: _stage(st.ring, B=2, E=1, P=40), '40 prefill tokens'),
    (lambda st: _stage(st.ring, B=2, E=1, P=9), '9 prefill tokens'),
    (lambda st: _stage(st.ring, B=2, W=10**6), 'width 1000000'),
    (lambda st: _stage(st.ring, B=2, W=3), 'width 3'),
    (lambda st: _stage(st.ring, B=2, T=-1), 'and -1 tokens'),
    (lambda st: _stage(st.ring, B=2, E=3), '3 prefill rows'),
    (lambda st: st.ring.commit(st.ring.take(), 5, 0, 0, 1, 5, False, False), 'batch=5'),
    (lambda st: st.ring.commit(st.ring.take(), 2, 0, 0, 10**6, 2, False, False), 'width=1000000'),
    (lambda st: st.ring.commit(st.ring.take(), 2, 0, 0, 1, 9, False, False), 'total_tokens=9'),
    (lambda st: st.ring.commit(st.ring.take(), 2, 3, 0, 1, 2, False, False), 'num_extends=3'),
    (lambda st: st.ring.commit(st.ring.take(), 2, 1, 5, 1, 2, False, False), 'prefill_tokens=5'),
    (lambda st: st.ring.commit(st.ring.take(), 0, 0, 0, 0, 0, False, False, 5), 'dummy_rows=5'),
    (lambda st: st.ring.commit(st.ring.take(), 1, 0, 0, 1, 1, False, False, sections=(64,) * 6 + (10**6,)),
     'sections'),
    (lambda st: st.ring.commit(st.ring.take(), 1, 0, 0, 1, 1, False, False, sections=(0,) * 7), 'sections'),
    (lambda st: st.ring.pack(st.ring.take(), 'pool', list(range(10**4)), 'req_pool_indices'), 'past the staging'),
    (lambda st: st.ring.pack(st.ring.take(), 'ids', [1] * 17, 'input_ids'), 'past the staging'),
    (lambda st: st.ring.pack(st.ring.take(), 'cache_start', [1], 'x'), 'past the staging'),
    (lambda st: st.ring.pack(st.ring.take(), 'pool', np.array([2**40]), 'req_pool_indices'), 'must hold int32'),
    (lambda st: st.ring.launch(CAPTURE), 'launch issues ring slots 0 and 1'),
    (lambda st: st.ring.launch(7), 'launch issues ring slots 0 and 1'),
    (lambda st: st.ring.commit(1 - st.ring.take(), 0, 0, 0, 0, 0, False, False), 'is not the slot the ring handed out'),
    (lambda st: st.ring.stage(5, [1], None, [], [], (), (), 0, 1, 1), 'is not the slot the ring handed out'),
    (lambda st: st.ring.pack(CAPTURE, 'pool', [1], 'p'), 'is not the slot the ring handed out'),
    (lambda st: st.ring.write_bound(o_input_ids=2**31), 'o_input_ids must be an integer in'),
    (lambda st: st.ring.write_bound(batch=3), 'batch is not a bound header field'),
    (lambda st: st(list(range(1, 5)), 10**6), 'uniform_input_length must be an integer in [1, 2]'),
    (lambda st: st.dummy(4, 10**6), 'total_tokens must be an integer in [0, 8]'),
    (lambda st: st.dummy(10**6, 1), 'batch_size must be an integer in [0, 4]'),
    (lambda st: st.issue_staged_decode(st.decode_slot(), 40, 1), 'batch of 40 requests is larger than max_bs=4'),
    (lambda st: st.issue_staged_decode(st.decode_slot(), 4, 10**6), 'uniform_input_length must be an integer in [1, 2]'),
]


@pytest.mark.parametrize('call, msg', _BAD_RING)
def test_public_ring_methods_never_write_outside_the_buffers(call, msg):
    "Refused by name, with the whole slab (every buffer, the staging, and the bytes between) and the state untouched."
    step, state = _step(2, max_bs=4, max_tok=8, W=2)
    step([1, 2], 2, [9, -1]); synchronize(DEV)
    slab, mem = step.buffers.slab.clone(), [t.clone() for t in state]
    with pytest.raises(ValueError, match=re.escape(msg)): call(step)
    synchronize(DEV)
    assert torch.equal(step.buffers.slab, slab)
    for t, b in zip(state, mem): assert torch.equal(t, b)
    step([3], 1); synchronize(DEV)                         # and the step still works
    assert step.buffers.req_pool_indices_buf.tolist() == [3, 0, 0, 0]


@settings(max_examples=15)
@given(st.lists(st.tuples(st.integers(1, 70), st.booleans(), st.sampled_from(['replayed', 'not replayed', 'idle']),
                          st.booleans(), st.booleans()), min_size=1, max_size=5), st.integers(0, 2**31 - 1))
def test_stage_captured_is_claim_then_stage(steps, seed):
    "The one-call `stage_captured`, falling back to `claim` + `stage` as its callers do, against `claim` + `stage`: same refusals, slot, tickets and flags."
    pair = []
    for _ in range(2):
        step, state = _step(seed, max_bs=70, max_tok=140, W=2, pool_rows=80)
        pair.append((step, capture(step.issue_captured, DEV)))
    for B, with_ovr, before, replace, bad in steps:
        pools = list(range(1, B + 1))
        ovr = ([-1, 5] * B)[:B] if with_ovr else None
        if bad and B: (ovr if with_ovr else pools)[-1] = 2**31                        # not an int32: nothing committed
        outs = []
        for one_call, (step, graph) in zip((True, False), pair):
            ring = step.ring
            if before == 'replayed': graph.replay()
            elif before == 'idle': graph.replay(); graph.replay()                     # the second runs no step
            synchronize(DEV)
            try:
                named = lambda: ring.stage(ring.claim(replace), pools, ovr, [], [], (), (), 0, 2, 2 * B)
                got = (ring.stage_captured(pools, ovr, [2] * B, 2, 2 * B, replace) or named()) if one_call else named()
            except RuntimeError as e: got = str(e)
            h = ring.slot_ints(CAPTURE)
            outs.append((got, h[:STEP_HEADER.size].tolist(), h[64:64 + 2 * B].tolist() if got is True else None,
                         ring.tickets, ring.idle_replays))
        assert outs[0] == outs[1]
