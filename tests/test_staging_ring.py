"""The staging ring (`tokenspeed_lit.staging.staging_ring`): the header declared once and read by name (the kernels' reads tied
to the declaration, the host's writes compiled from it), the copy that moves exactly a slot's staged ints, the rule of
when a slot is free (done flags and tickets), the one submit (ring slots in turn, the capture slot apart; a plan
written in one pack or list by list stages the same ints), the capture slot's rules (a replay with nothing new staged
runs no step, from construction on, and is counted; a refused restaging leaves nothing staged), leases of slots
(foreign, stale and rebound slots refused), the pool-row check on both its paths, and every public ring method
refusing host input that would write outside the declared buffers."""
import ast, inspect, re
from pathlib import Path
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tokenspeed_lit.staging import staging_ring as sr, fused_decode as fd, step_plan as sp
from tokenspeed_lit.core.device import host_full
from tokenspeed_lit.core.graphs import capture
from tokenspeed_lit.core.streams import synchronize
from tokenspeed_lit.staging.header_layout import HeaderLayout
from tokenspeed_lit.staging.step_plan import (STEP_HEADER, HDR, LISTS_AT, ForwardOp, MAMBA_FIELDS, ONE_PACK, IDS_COPIED,
                                              BY_SECTION, PACKING, same_step, staging_layout)
from tokenspeed_lit.staging.staging_ring import StagingRing, copy_slot, CAPTURE
from tokenspeed_lit.staging.fused_decode import FusedDecodeStep

from conftest import DEV, random_table, kernel_examples
KERNEL_50 = settings(max_examples=kernel_examples(50))  # kernel properties at a GPU's default count, CI's under `ci`
POISON = -77
PKG = Path(sr.__file__).parent


def _step(seed=0, max_bs=4, max_tok=8, W=2, pool_rows=10, vocab=40, has_mamba=False):
    "A bound step of `max_bs` rows over a random state: (step, [cache lengths, input map, ready, table])."
    g = torch.Generator().manual_seed(seed)
    vcl = torch.randint(0, 10, (pool_rows,), generator=g, dtype=torch.int32)
    fim = torch.randint(0, vocab, (pool_rows, W), generator=g, dtype=torch.int32)
    ready = torch.rand(pool_rows, generator=g) < 0.5
    table = random_table(g, pool_rows, 4)
    state = [t.to(DEV) for t in (vcl, fim, ready, table)]
    step = FusedDecodeStep.create(max_bs, max_tok, 4, dummy_kv_slot=1, state_write_padding_pool_index=pool_rows,
                                  device=DEV, has_mamba=has_mamba)
    return step.bind(state[0], state[1], state[2], vocab, state[3]), state


def _slot_of(ring, ticket):
    "The slot a step was issued in: the one whose last ticket it is."
    return ring.tickets.index(ticket)


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
    assert sr.HDR is HDR and fd.HDR is HDR                  # one declaration (step_plan's), read by both modules
    srcs = _jit_sources()
    assert {'_copy_kernel', '_fill_kernel', '_request_rows', '_mamba_rows', '_decode_rows', '_token_tiles'} <= set(srcs)
    read = set()
    for name, src in srcs.items():
        fields = set(re.findall(r'\bHDR\.(\w+)', src))
        assert fields <= set(STEP_HEADER.names), (name, fields - set(STEP_HEADER.names))
        read |= fields
        assert not re.search(r'tl\.load\(\s*(s32|src|hdr)\s*\+\s*\d', src), f'{name} reads the header at a literal offset'
    # every per-step and bound field is read by some kernel: a declared field the kernels ignore is a mistake
    want = set(STEP_HEADER.groups['step']) | set(STEP_HEADER.groups['ring']) | set(STEP_HEADER.groups['bound'])
    unread = want - read - {f'o_mamba{k}' for k in (1, 2, 3)}     # read as o_mamba0 + k
    assert not unread, f'declared but read by no kernel: {sorted(unread)}'


def test_no_header_field_is_written_by_a_literal_index():
    "The host writes header fields only through the declaration (its writers, `HEADER(...)` compiled into stores, offsets by name): no `m[<int>] = ...` where steps are planned and staged."
    bad = []
    for p in (PKG / 'staging_ring.py', PKG / 'fused_decode.py', PKG / 'input_buffers.py', PKG / 'step_plan.py'):
        for node in ast.walk(ast.parse(p.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
            for t in targets:
                for t in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                            and isinstance(t.slice.value, int) and not isinstance(t.value, ast.Attribute)):
                        bad.append(f'{p.name}:{node.lineno}')
    assert not bad, f'writes by a literal index: {bad}'


def test_the_ring_writes_the_header_by_name():
    "The ring's one submit writes the header with `HEADER(m, field=...)`, compiled into one store per field (never called); the other writes are the declaration's writers."
    src = inspect.getsource(StagingRing)
    assert src.count('HEADER(m,') == 1 and '@STEP_HEADER.inline' in src
    issue = StagingRing._issue
    assert 'HEADER' not in issue.__code__.co_names, 'HEADER(...) left as a call'
    assert sr._write_step.__code__.co_varnames[1:sr._write_step.__code__.co_argcount] == \
        STEP_HEADER.groups['step'] + STEP_HEADER.groups['ring']
    assert LISTS_AT == STEP_HEADER.at['ticket'] + 1 and STEP_HEADER.names[-2:] == ('slot', 'ticket')
    assert staging_layout(4, 8)['pool'] == STEP_HEADER.size == 64 > LISTS_AT



def test_the_ring_writes_each_header_field_where_the_declaration_puts_it():
    "The one submit packs the plan's header fields, the slot and the ticket in the declared order (the plan's leading fields are the header's step fields): each lands at its declared offset, the lists right after them."
    assert sp.PLAN_FIELDS[:len(STEP_HEADER.groups['step'])] == STEP_HEADER.groups['step']
    step, _ = _step(has_mamba=True)
    ring = step.ring
    for op in (ForwardOp([0, 1], [3, 5], [2, 2], decode_input_ids=[-1, 7], mamba_pool_indices=[1, 2],
                         mamba_cow_src_indices=[-1, 3], mamba_branching_seqlens=[-1, -1], mamba_track_pool_indices=[4, -1]),
               ForwardOp([0, 1], [2, 6], [3, 2], input_ids=[5, 6, 7], shifted_input_ids=[6, 7, 8], extend_prefix_lens=[0],
                         prefill_lengths=[4])):
        plan = ring.planner.plan(op, sum(op.input_lengths))
        t = ring.submit(plan)
        h, p = ring.slot_ints(_slot_of(ring, t)), sp.StepPlan(*plan)
        for f in STEP_HEADER.groups['step']: assert h[STEP_HEADER.at[f]] == int(getattr(p, f)), f
        assert (h[STEP_HEADER.at['slot']], h[STEP_HEADER.at['ticket']]) == (_slot_of(ring, t), t)
        assert tuple(h[sp.LISTS_AT:p.staged].tolist()) == sp.staged_ints(plan)[len(STEP_HEADER.groups['step']):]
        synchronize(DEV)
    assert LISTS_AT == STEP_HEADER.at['ticket'] + 1 and STEP_HEADER.names[-2:] == ('slot', 'ticket')
    assert staging_layout(4, 8)['pool'] == STEP_HEADER.size == 64 > LISTS_AT

def test_header_writes_must_name_every_field_once():
    layout = HeaderLayout(8, step=('a', 'b'), ring=('c',))
    def two(m): HEADER(m, a=1, b=2)                                           # noqa: F821 (compiled away)
    def extra(m): HEADER(m, a=1, b=2, c=3, d=4)                               # noqa: F821
    with pytest.raises(NameError, match=re.escape("missing ['c']")): layout.inline(two)
    with pytest.raises(NameError, match=re.escape("not fields or named twice ['d']")): layout.inline(extra)
    def ok(m): HEADER(m, c=3, a=1, b=2)                                       # noqa: F821
    m = [0] * 8
    layout.inline(ok)(m)
    assert m[:4] == [1, 2, 3, 0]


@given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=len(STEP_HEADER.names), max_size=len(STEP_HEADER.names)))
def test_the_writer_stores_each_field_at_its_declared_offset(values):
    m = np.full(STEP_HEADER.size, POISON, np.int32)
    STEP_HEADER.writer(STEP_HEADER.names)(memoryview(m), *values)
    assert m[:len(values)].tolist() == values and (m[len(values):] == POISON).all()
    assert [getattr(HDR, n) for n in STEP_HEADER.names] == list(range(len(values)))


def test_a_field_declared_twice_or_too_many_are_refused():
    with pytest.raises(ValueError, match='declared twice'): HeaderLayout(8, a=('x', 'y'), b=('x',))
    with pytest.raises(ValueError, match='do not fit 2 ints'): HeaderLayout(2, a=('x', 'y', 'z'))


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
    for plan in (ring.planner.dummy(0, 0), ring.planner.decode([1, 2], 1), ring.planner.dummy(2, 4),
                 ring.planner.plan(ForwardOp([0], [3], [2]), 2)):
        t = ring.submit(plan); synchronize(DEV)
        s = _slot_of(ring, t)
        got.append(s)
        assert ring.slot_ints(s)[[HDR.slot, HDR.ticket]].tolist() == [s, t] and int(ring.done_flags[s]) == t
    assert got == [0, 1, 0, 1]
    before = ring.tickets[:2]
    t = ring.submit(ring.planner.decode([3], 1), captured=True)
    assert _slot_of(ring, t) == CAPTURE and ring.tickets[:2] == before
    assert ring.slot_ints(CAPTURE)[[HDR.slot, HDR.ticket, HDR.batch]].tolist() == [CAPTURE, t, 1]
    assert _slot_of(ring, ring.submit(ring.planner.dummy(0, 0))) == 0      # the ring's turn goes on where it was


def _issue_one(step, way, pools):
    "Issue one decode step of `pools` (width 1) the way named; returns its ticket."
    ring = step.ring
    if way == 'lists': return ring.submit(ring.planner.decode(pools, 1))
    if way == 'staged':
        sl = step.decode_slot(); sl.put(pools); step.issue_staged_decode(sl, len(pools), 1)
    elif way == 'fill': step.fill(ForwardOp(list(range(len(pools))), pools, [1] * len(pools)), len(pools))
    elif way == 'call': step(pools, 1)
    else: step.dummy(len(pools), len(pools))
    return max(ring.tickets[:2])


@KERNEL_50
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(['lists', 'staged', 'fill', 'call', 'dummy'])),
                min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_done_flags_show_each_issued_ticket(steps, seed):
    "After every step its ring slot's done flag holds the ticket it was issued with; tickets never repeat and only grow."
    step, state = _step(seed, W=1)
    ring, last = step.ring, 0
    for batch, way in steps:
        t = _issue_one(step, way, list(range(1, batch + 1)))
        synchronize(DEV)
        s = _slot_of(ring, t)
        assert s in (0, 1) and t > last and int(ring.done_flags[s]) == t
        last = t


def test_a_copy_that_never_runs_is_an_error_not_a_hang():
    "A slot whose launched copy never reports is refused after the wait's timeout, naming the slot and its ticket."
    step, _ = _step(W=1)
    ring = step.ring
    t = ring.submit(ring.planner.dummy(0, 0)); synchronize(DEV)
    s = _slot_of(ring, t)
    ring.done_flags[s] = -5                                # as if the launch were lost before its copy ran
    assert not ring._copied(s)
    assert ring._take() == 1 - s                           # the other slot
    with pytest.raises(RuntimeError, match=f'host slot {s}: its step \\(ticket {t}\\) was launched but its '
                                           f'copy never ran \\(done flag -5\\)'):
        ring._wait(s, timeout=0.05)
    ring.done_flags[s] = t                                 # put it back: the ring works on
    step([1, 2], 1); synchronize(DEV)
    assert step.buffers.req_pool_indices_buf.tolist()[:3] == [1, 2, 0]


def test_tickets_restart_before_they_leave_int32():
    step, _ = _step()
    ring = step.ring
    ring._ticket = 0x7fffffff - 1
    step.dummy(1, 1); step.dummy(1, 1)               # the last ticket, then a restart: the flags count from 1 again
    synchronize(DEV)
    assert max(ring.tickets) == 1 and int(ring.done_flags[:3].max()) == 1
    step([1], 1); synchronize(DEV)
    assert max(ring.tickets) == 2 and int(ring.done_flags[:3].max()) == 2


# ---- one plan, two ways to write it: the same slot ints, the same buffers ----------------------------------------

FORMS = {'list': list, 'int32': lambda v: np.array(v, dtype=np.int32), 'int64': lambda v: np.array(v, dtype=np.int64),
         'tuple': tuple}


@st.composite
def _decode_or_mixed(draw, max_bs, max_tok, W, pool_rows, has_mamba, captured):
    B = draw(st.integers(0, max_bs))
    E = 0 if captured else draw(st.sampled_from([0, B]) | st.integers(0, B))
    B = min(B, E + max_tok // W)
    budget = max_tok - (B - E) * W
    pre = draw(st.lists(st.integers(0, 3), min_size=E, max_size=E))
    while sum(pre) > budget: pre[pre.index(max(pre))] -= 1
    P = sum(pre)
    pools = draw(st.permutations(range(pool_rows)))[:B]
    prefix = draw(st.lists(st.integers(0, 9), min_size=E, max_size=E))
    full = [p + n + draw(st.integers(0, 1)) for p, n in zip(prefix, pre)]
    ids, shifted = (draw(st.lists(st.integers(-3, 50), min_size=P, max_size=P)) for _ in range(2))
    ovr = draw(st.none() | st.lists(st.just(-1) | st.integers(-3, 50), min_size=B - E, max_size=B - E))
    mamba = {f: draw(st.lists(st.integers(-1, 9), min_size=B, max_size=B)) for f in MAMBA_FIELDS} \
        if has_mamba and draw(st.booleans()) else {}
    return dict(request_ids=list(range(B)), request_pool_indices=pools, input_lengths=pre + [W] * (B - E),
                input_ids=ids, shifted_input_ids=shifted, extend_prefix_lens=prefix, prefill_lengths=full,
                decode_input_ids=ovr, **mamba), P + (B - E) * W


def _outcome(step, state, s):
    synchronize(DEV)
    return (step.ring.slot_ints(s).tolist(), {k: v.cpu() for k, v in step.buffers.buffers().items()},
            [t.cpu() for t in state[:3]])


def _same(a, b):
    assert a[0] == b[0], 'slot ints differ'
    for k, v in a[1].items(): assert torch.equal(v, b[1][k]), k
    for x, y in zip(a[2], b[2]): assert torch.equal(x, y)


@settings(max_examples=15)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.sampled_from(['list', 'int32', 'int64']), st.data()),
                min_size=1, max_size=3), st.booleans(), st.integers(0, 2**31 - 1))
def test_one_pack_and_by_section_stage_the_same_step(steps, has_mamba, seed):
    "The same step planned from lists (one pack: per-int stores when small, one `struct` pack when large; token ids as int32 arrays copied) and from numpy arrays (list by list): the same slot ints, buffers and state after the copy, in a ring slot or the capture slot."
    max_bs, max_tok, W, pool_rows = 70, 140, 2, 80
    pair = []
    for _ in range(2):
        step, state = _step(seed, max_bs=max_bs, max_tok=max_tok, W=W, pool_rows=pool_rows, has_mamba=has_mamba)
        pair.append((step, state, capture(step.issue_captured, DEV)))
    for captured, replace, ids_form, data in steps:
        kw, total = data.draw(_decode_or_mixed(max_bs, max_tok, W, pool_rows, has_mamba, captured))
        ids = {k: FORMS[ids_form](kw[k]) for k in ('input_ids', 'shifted_input_ids')}
        lists = ForwardOp(**{**kw, **ids})
        arrays = ForwardOp(**{k: v if v is None or k == 'request_ids' else np.array(v, dtype=np.int64)
                              for k, v in kw.items()})
        outs = []
        for (step, state, graph), op in zip(pair, (lists, arrays)):
            ring = step.ring
            plan = ring.planner.plan(op, total, captured)
            if op is arrays: assert plan[PACKING] == BY_SECTION
            else: assert plan[PACKING] == (IDS_COPIED if ids_form != 'list' and kw['extend_prefix_lens'] else ONE_PACK)
            t = ring.submit(plan, captured, replace)
            if captured: graph.replay()
            outs.append(_outcome(step, state, _slot_of(ring, t)))
        assert same_step(pair[0][0].ring.planner.plan(lists, total, captured), pair[1][0].ring.planner.plan(arrays, total, captured))
        _same(*outs)


def _spoil(values, at, how):
    v = list(values)
    v[at] = {'big': 2**31, 'small': -2**31 - 1, 'float': 1.5}[how]
    return v


@settings(max_examples=20)
@given(B=st.integers(1, 70), where=st.sampled_from(['decode_input_ids', *MAMBA_FIELDS]),
       how=st.sampled_from(['big', 'small', 'float']), pools_as_array=st.booleans(),
       before=st.sampled_from(['nothing', 'replayed', 'not replayed']), data=st.data())
def test_a_value_that_is_not_int32_is_refused_by_name_and_leaves_no_step(B, where, how, pools_as_array, before, data):
    "A plan whose list holds a value that is not an int32 (small steps stored int by int, large ones packed, list by list beside arrays): `submit` names the list and the value, and the capture slot's next replay runs no step."
    step, state = _step(3, max_bs=70, max_tok=140, W=2, pool_rows=80, has_mamba=True)
    ring, graph = step.ring, capture(step.issue_captured, DEV)
    if before != 'nothing':
        step([1, 2], 2, [5, -1], captured=True)
        if before == 'replayed': graph.replay()
        synchronize(DEV)
    pools = data.draw(st.permutations(range(1, 80)))[:B]
    lists = {f: [0] * B for f in MAMBA_FIELDS}
    lists['decode_input_ids'] = [-1] * B
    at = data.draw(st.integers(0, B - 1))
    lists[where] = _spoil(lists[where], at, how)
    op = ForwardOp(list(range(B)), np.array(pools) if pools_as_array else pools, [2] * B, **lists)
    plan = ring.planner.plan(op, 2 * B, True)
    assert plan[PACKING] == (BY_SECTION if pools_as_array else ONE_PACK)
    bad = lists[where][at]
    with pytest.raises(ValueError, match=re.escape(f'{where} must hold int32 integers, got {where}[{at}] = {bad!r}')):
        ring.submit(plan, captured=True)
    _replay_runs_no_step(step, state, graph)


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


def _replay_runs_no_step(step, state, graph):
    "Replay on poisoned buffers: no step run, the idle replay counted and reported once; serving goes on."
    synchronize(DEV)
    idle = step.ring.idle_replays
    mem = _poisoned_state(step, state)
    graph.replay(); synchronize(DEV)
    _ran_no_step(step, state, mem)
    assert step.ring.idle_replays == idle + 1
    with pytest.raises(RuntimeError, match='replayed the capture slot 1 time'): step.ring.lease(captured=True)
    step([3], 2, captured=True); graph.replay(); synchronize(DEV)    # reported once: serving goes on
    assert step.buffers.req_pool_indices_buf.tolist()[:2] == [3, 0]


@pytest.mark.parametrize('before', ['construction', 'bind', 'ring step', 'dummy', 'replayed step', 'refused restage',
                                    'refused plan', 'lease'])
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
    elif before == 'refused plan':
        step([3, 4], 2, [7, -1], captured=True)                      # staged, never replayed
        with pytest.raises(ValueError, match='outside the pool'):      # refused by the planner: the slot cleared
            step([5, 60], 2, captured=True)
    elif before == 'lease':                                           # a lease of the capture slot never issued
        step([3, 4], 2, [7, -1], captured=True)
        sl = step.decode_slot(captured=True); sl.put([5, 6], [8, 9])
    _replay_runs_no_step(step, state, graph)


def test_a_replay_runs_a_staged_step_once():
    "The second replay of the same staged step leaves the overrides applied once."
    step, state = _step(3)
    graph = capture(step.issue_captured, DEV)
    assert step([3, 4], 2, [7, -1], captured=True) == [7, -1]
    graph.replay(); synchronize(DEV)
    assert step.buffers.req_pool_indices_buf.tolist()[:3] == [3, 4, 0]
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
    with pytest.raises(ValueError, match='capture the graph again'):
        step.ring.submit(step.ring.planner.dummy(0, 0), captured=True)


# ---- leases ----------------------------------------------------------------------------------------------------------

def _foreign(step):
    other, _ = _step(9)
    return other.decode_slot()

_BAD_LEASES = [   # (how the slot goes wrong, what the refusal names)
    ('another InputBuffers', lambda st: _foreign(st), 'handed out by another InputBuffers'),
    ('issued twice', lambda st: (lambda sl: (sl.put([1]), st.issue_staged_decode(sl, 1, 1), sl)[-1])(st.decode_slot()),
     'is stale'),
    ('ring took a slot since', lambda st: (lambda sl: (st([2], 1), sl)[-1])(st.decode_slot()), 'is stale'),
    ('a plan submitted since', lambda st: (lambda sl: (st.ring.submit(st.ring.planner.dummy(0, 0)), sl)[-1])(st.decode_slot()),
     'is stale'),
    ('a later decode_slot', lambda st: (lambda sl: (st.decode_slot(), sl)[-1])(st.decode_slot()), 'is stale'),
    ('captured, then a list step', lambda st: (lambda sl: (st([2], 1), sl)[-1])(st.decode_slot(captured=True)), 'is stale'),
    ('ring slot, then a captured step', lambda st: (lambda sl: (st([2], 1, captured=True), sl)[-1])(st.decode_slot()),
     'is stale'),
    ('after a dummy step', lambda st: (lambda sl: (st.dummy(1, 1), sl)[-1])(st.decode_slot()), 'is stale'),
    ('after a fill', lambda st: (lambda sl: (st.fill(ForwardOp([0], [2], [2]), 2), sl)[-1])(st.decode_slot()), 'is stale'),
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
    with pytest.raises(ValueError, match=re.escape(msg)): step.ring.submit_lease(sl, step.ring.planner.leased(1, 1))
    synchronize(DEV)
    for k, v in step.buffers.buffers().items(): assert torch.equal(v, snap[k]), k
    for t, b in zip(state[:3], mem): assert torch.equal(t, b)


def test_a_lease_survives_a_bind_but_not_its_old_plans():
    "A slot handed out before a bind is still the latest lease; a plan made before the bind is refused, one made after is issued."
    step, state = _step(2)
    sl = step.decode_slot(); sl.put([3, 4])
    old = step.ring.planner.leased(2, 2)
    step.bind(*state[:3], 40, state[3].clone())
    with pytest.raises(ValueError, match='the plan was made by another planner'): step.ring.submit_lease(sl, old)
    assert step.ring.submit_lease(sl, step.ring.planner.leased(2, 2)) is False
    synchronize(DEV)
    assert step.buffers.req_pool_indices_buf.tolist() == [3, 4, 0, 0]


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


@KERNEL_50
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
        if n:
            has = step.issue_staged_decode(sl, n, 1, overrides=with_overrides)
            assert has == (with_overrides and ovr.count(-1) != n)
    synchronize(DEV)


# ---- the pool rows: builtins up to _BUILTIN_ROWS rows, numpy above ----------------------------------------------------

def _pools_error_ref(rows, num_pool, name='req_pool_indices'):
    "The message check_pools must raise for `rows`, or None: the first value out of range, else the first pair."
    bad = [r for r in rows if not 0 <= r < num_pool]
    if bad: return f'{name} holds {bad[0]}, outside the pool [0, {num_pool})'
    for j, r in enumerate(rows):
        if r in rows[:j]: return f'{name} holds pool row {r} twice (requests {rows.index(r)} and {j})'
    return None


_RINGS = {}

@given(batch=st.integers(0, 300) | st.sampled_from([1, sp._BUILTIN_ROWS, sp._BUILTIN_ROWS + 1]),
       num_pool=st.sampled_from([1, 7, 300, 600]), kind=st.sampled_from(['ok', 'dup', 'neg', 'high', 'int32 edge']),
       form=st.sampled_from(['list', 'int32']), data=st.data())
def test_check_pools_on_both_paths(batch, num_pool, kind, form, data):
    "Both ways check_pools checks (builtins up to _BUILTIN_ROWS rows, numpy above), on lists and int32 arrays, refuse what the reference refuses."
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
    arg = rows if form == 'list' else np.array(rows, dtype=np.int32)
    want = _pools_error_ref(rows, num_pool)
    sl = step.decode_slot()                  # the same rows written into a lease: the same verdict when it is issued
    sl.req_pool_indices[:len(rows)] = rows
    for check in (lambda: step.ring.planner.check_pools(arg, 'req_pool_indices'),
                  lambda: step.issue_staged_decode(sl, len(rows), 1)):
        if want is None: check()
        else:
            with pytest.raises(ValueError, match=re.escape(want)): check()


# ---- every public ring method: host input that would write outside the buffers is refused --------------------------

def _other_plan(st):
    other, _ = _step(9)
    return other.ring.planner.decode([1], 1)


def _stale_plan(st):
    "A plan of the step's planner before a bind (the same state, a new table)."
    plan = st.ring.planner.decode([1], 1)
    c, m, r, t, v, _ = st.binding
    st.bind(c, m, r, v, t.clone())
    return plan


def _stale_lease(st):
    sl = st.decode_slot(); sl.put([1])
    st.ring.submit(st.ring.planner.dummy(0, 0))
    return sl


_BAD_RING = [   # (prepare on a bound step of max_bs=4, max_num_tokens=8, width 2 -> the call; what the refusal names)
    (lambda st: lambda: st.ring.submit(_other_plan(st)), 'the plan was made by another planner'),
    (lambda st: (lambda p: lambda: st.ring.submit(p))(_stale_plan(st)), 'the plan was made by another planner'),
    (lambda st: (lambda p: lambda: st.ring.submit(p, captured=True))(_stale_plan(st)), 'the plan was made by another planner'),
    (lambda st: lambda: st.ring.submit(st.ring.planner.leased(1, 1)), 'a plan of a leased slot is issued with submit_lease'),
    (lambda st: lambda: st.ring.submit(st.ring.planner.leased(1, 1), captured=True), 'a plan of a leased slot'),
    (lambda st: lambda: st.ring.submit((1, 2)), "plan must be a plan made by the ring's planner"),
    (lambda st: lambda: st.ring.submit(st.ring.planner.dummy(0, 0)[:-1]), "plan must be a plan made by the ring's planner"),
    (lambda st: lambda: st.ring.submit(list(st.ring.planner.dummy(0, 0))), "plan must be a plan made by the ring's planner"),
    (lambda st: lambda: st.ring.submit(None), "plan must be a plan made by the ring's planner"),
    (lambda st: lambda: st.ring.submit(st.ring.planner.dummy(0, 0), captured=1), 'captured must be True or False'),
    (lambda st: lambda: st.ring.submit(st.ring.planner.dummy(0, 0), captured=True, replace=None),
     'replace must be True or False'),
    (lambda st: lambda: st.ring.submit(st.ring.planner.plan(ForwardOp([0, 1], [1, 2], [2, 2], decode_input_ids=[5, 2**31]), 4)),
     'decode_input_ids must hold int32 integers, got decode_input_ids[1] = 2147483648'),
    (lambda st: lambda: st.ring.submit(st.ring.planner.decode([1, 2.5], 2)),
     'req_pool_indices must hold int32 integers, got req_pool_indices[1] = 2.5'),
    (lambda st: lambda: st.ring.submit_lease(st.decode_slot(), _other_plan(st)), 'the plan was made by another planner'),
    (lambda st: (lambda sl: lambda: st.ring.submit_lease(sl, st.ring.planner.leased(1, 1)))(_stale_lease(st)), 'is stale'),
    (lambda st: (lambda sl: lambda: st.ring.submit_lease(sl, st.ring.planner.leased(1, 1)))(_foreign(st)),
     'handed out by another InputBuffers'),
    (lambda st: lambda: st.ring.submit_lease(st.decode_slot(), (1, 2)), "plan must be a plan made by the ring's planner"),
    (lambda st: lambda: st.ring.submit_lease(st.decode_slot(), st.ring.planner.decode([1], 1)),
     'a plan from lists is issued with submit(plan); a leased slot takes planner.leased(...)'),
    (lambda st: lambda: st.ring.submit_lease(st.decode_slot(), st.ring.planner.dummy(1, 1)), 'a plan from lists is issued'),
    (lambda st: (lambda sl: (sl.put([3, 3]), lambda: st.ring.submit_lease(sl, st.ring.planner.leased(2, 1)))[1])(st.decode_slot()),
     'req_pool_indices holds pool row 3 twice (requests 0 and 1)'),
    (lambda st: (lambda sl: (sl.put([3, 10]), lambda: st.ring.submit_lease(sl, st.ring.planner.leased(2, 1)))[1])(st.decode_slot()),
     'req_pool_indices holds 10, outside the pool [0, 10)'),
    (lambda st: lambda: st.ring.lease(captured='yes'), 'captured must be True or False'),
    (lambda st: lambda: st.ring.lease(captured=True, replace=0), 'replace must be True or False'),
    (lambda st: lambda: st.ring.slot_ints(3), 'slot must be an integer in [0, 2]'),
    (lambda st: lambda: st.ring.write_bound(o_input_ids=2**31), 'o_input_ids must be an integer in'),
    (lambda st: lambda: st.ring.write_bound(page_size=8, o_input_ids=2**31), 'o_input_ids must be an integer in'),
    (lambda st: lambda: st.ring.write_bound(page_size=8, batch=3), 'batch is not a bound header field'),
    (lambda st: lambda: st.ring.write_bound(ticket=3), 'ticket is not a bound header field'),
    (lambda st: lambda: st.ring.write_bound(max_bs=3), "max_bs is the ring's own bound field"),
    (lambda st: lambda: st.ring.write_bound(s_cache_start=0), "s_cache_start is the ring's own bound field"),
    (lambda st: lambda: st.ring.write_bound(o_positions=1.0), 'o_positions must be an integer'),
    (lambda st: lambda: st.ring.write_bound(o_input_ids=10**6), 'o_input_ids=1000000: its buffer (8 elements of 4 bytes) must lie in the slab'),
    (lambda st: lambda: st.ring.write_bound(o_positions=0), 'o_positions=0: its buffer (8 elements of 8 bytes) must lie in the slab past the staging'),
    (lambda st: lambda: st.ring.write_bound(o_force=-1), 'o_force=-1: its buffer'),
    (lambda st: lambda: st.ring.write_bound(has_mamba_buffers=1), 'o_mamba0=0: its buffer'),
    (lambda st: lambda: st.ring.write_bound(has_mamba_buffers=2), 'has_mamba_buffers must be 0 or 1, got 2'),
    (lambda st: lambda: st.ring.write_bound(page_size=0), 'page_size must be an integer >= 1, got 0'),
    (lambda st: lambda: st.ring.bind(lambda p: None, num_pool=10, fim_width=2, table_batch_order=-1),
     'table_batch_order must be 0 or 1, got -1'),
    (lambda st: lambda: st.ring.bind(lambda p: None, num_pool=0, fim_width=2), 'num_pool must be an integer in [1,'),
    (lambda st: lambda: st.ring.bind(lambda p: None, num_pool=10), 'fim_width must be an integer, got None'),
    (lambda st: lambda: st.ring.bind(lambda p: None, num_pool=10, fim_width=2, o_seq_lens=-2**31 - 1),
     'o_seq_lens must be an integer in'),
    (lambda st: lambda: st(list(range(1, 5)), 10**6), 'uniform_input_length must be an integer in [1, 2]'),
    (lambda st: lambda: st(list(range(1, 6)), 1), 'batch of 5 requests is larger than max_bs=4'),
    (lambda st: lambda: st([1, 2, 3, 4, 5], 1, captured=True), 'batch of 5 requests is larger than max_bs=4'),
    (lambda st: lambda: st([1, 2], 1, decode_input_ids=[5, 2**31], captured=True), 'decode_input_ids must hold int32'),
    (lambda st: lambda: st.fill(ForwardOp([0, 1], [1, 2], [5, 2], [1] * 5, [1] * 5, [0], [5]), 6), 'total_tokens=6 differs from sum(input_lengths)=7'),
    (lambda st: lambda: st.fill(ForwardOp([0], [1], [9], [1] * 9, [1] * 9, [0], [9]), 9),
     'total_tokens=9 must be an integer in [0, max_num_tokens=8]'),
    (lambda st: lambda: st.dummy(4, 10**6), 'total_tokens must be an integer in [0, 8]'),
    (lambda st: lambda: st.dummy(10**6, 1), 'batch_size must be an integer in [0, 4]'),
    (lambda st: lambda: st.issue_staged_decode(st.decode_slot(), 40, 1), 'batch of 40 requests is larger than max_bs=4'),
    (lambda st: lambda: st.issue_staged_decode(st.decode_slot(), 4, 10**6), 'uniform_input_length must be an integer in [1, 2]'),
    (lambda st: lambda: st.issue_staged_decode(st.decode_slot(), 1, 1, mamba=True), 'mamba=True, but the buffers have no Mamba'),
    (lambda st: lambda: st.issue_staged_decode(st.decode_slot(), 1, 1, overrides=1), 'overrides must be True or False'),
]


@pytest.mark.parametrize('prepare, msg', _BAD_RING)
def test_public_ring_methods_never_write_outside_the_buffers(prepare, msg):
    "Refused by name, with the whole slab (every buffer, the staging, and the bytes between) and the state untouched."
    step, state = _step(2, max_bs=4, max_tok=8, W=2)
    graph = capture(step.issue_captured, DEV)
    step([1, 2], 2, [9, -1]); synchronize(DEV)
    call = prepare(step)
    synchronize(DEV)
    slab, mem = step.buffers.slab.clone(), [t.clone() for t in state]
    with pytest.raises(ValueError, match=re.escape(msg)): call()
    synchronize(DEV)
    assert torch.equal(step.buffers.slab, slab)
    for t, b in zip(state, mem): assert torch.equal(t, b)
    step([3], 1); synchronize(DEV)                         # and the step still works
    assert step.buffers.req_pool_indices_buf.tolist() == [3, 0, 0, 0]


def test_a_leased_slots_mamba_rows_are_issued_all_or_none():
    "With Mamba buffers, a lease's Mamba rows start unwritten: a step issued with mamba=True that left one unwritten, or one issued without them that wrote one (it would be dropped), is refused naming the list and row, with nothing staged; written whole, they reach the buffers."
    step, state = _step(3, has_mamba=True)
    step([1, 2], 2); synchronize(DEV)
    slab = step.buffers.slab.clone()
    sl = step.decode_slot(); sl.put([4, 5]); sl.mamba[:, :2] = [[1, 2], [-1, 3], [-1, -1], [6, -1]]
    with pytest.raises(ValueError, match=re.escape('mamba_pool_indices[0] was written into the slot (staged.mamba[0, 0]), but the step is issued with mamba=False')):
        step.issue_staged_decode(sl, 2, 1)
    sl.mamba[3, 1] = sr.UNWRITTEN
    with pytest.raises(ValueError, match=re.escape('mamba_track_pool_indices[1] was not written into the slot (staged.mamba[3, 1])')):
        step.issue_staged_decode(sl, 2, 1, mamba=True)
    synchronize(DEV)
    assert torch.equal(step.buffers.slab, slab)
    sl.mamba[3, 1] = 7
    step.issue_staged_decode(sl, 2, 1, mamba=True); synchronize(DEV)
    b = step.buffers
    assert [getattr(b, f + '_buf')[:3].tolist() for f in MAMBA_FIELDS] == [[1, 2, -1], [-1, 3, -1], [-1, -1, -1], [6, 7, -1]]
    sl = step.decode_slot(); sl.put([4])                   # a dense step on Mamba buffers: rows -1
    step.issue_staged_decode(sl, 1, 1); synchronize(DEV)
    assert [getattr(b, f + '_buf')[:2].tolist() for f in MAMBA_FIELDS] == [[-1, -1]] * 4


def test_a_plan_changed_by_hand_reads_only_the_staging():
    "The kernel clamps every staged list's start (and the Mamba stride, the prefill count) into the staging: a plan whose header fields were changed by hand after the planner made it runs without reading or writing outside the slab, and the step works after it."
    step, state = _step(5, has_mamba=True)
    op = ForwardOp([0, 1], [1, 2], [2, 2], decode_input_ids=[4, -1], mamba_pool_indices=[1, 2], mamba_cow_src_indices=[-1, -1],
                   mamba_branching_seqlens=[-1, -1], mamba_track_pool_indices=[-1, 3])
    plan, P = step.ring.planner.plan(op, 4), sp.PLAN
    for f, v in (('s_pool', 10**9), ('s_pool', -10**9), ('s_override', 2**31 - 1), ('s_mamba', 2**31 - 1),
                 ('mamba_stride', 10**6), ('mamba_stride', -10**6), ('s_ids', -5), ('shifted_at', 10**8),
                 ('s_lengths', 10**9), ('s_extend_prefix', -10**9), ('num_extends', -10**6), ('num_extends', 10**6)):
        step.ring.submit(plan[:P[f]] + (v,) + plan[P[f] + 1:])
        synchronize(DEV)
    step([3], 2); synchronize(DEV)
    assert step.buffers.req_pool_indices_buf.tolist() == [3, 0, 0, 0]


def test_after_the_tickets_wrap_a_replay_with_nothing_new_runs_no_step():
    "Tickets count from 0 again after 2**31 - 1: the capture slot's last step stays spent (the graph's next replay runs no step and is counted idle), and the next steps are staged and run as before."
    step, state = _step(6)
    graph = capture(step.issue_captured, DEV)
    ring = step.ring
    ring._ticket = sr._TICKET_MAX - 2                   # two tickets before the wrap
    step([3], 2, captured=True); graph.replay(); synchronize(DEV)
    assert step.buffers.req_pool_indices_buf[:2].tolist() == [3, 0]
    step([5], 2); step([6], 2); synchronize(DEV)         # the second one wraps
    assert ring.tickets[CAPTURE] == 0 and max(ring.tickets) == 1
    assert step.buffers.req_pool_indices_buf[:2].tolist() == [6, 0]
    idle = ring.idle_replays
    graph.replay(); synchronize(DEV)                     # nothing new staged: no step, not the old one
    assert ring.idle_replays == idle + 1 and step.buffers.req_pool_indices_buf[:2].tolist() == [0, 0]
    with pytest.raises(RuntimeError, match='replayed the capture slot 1 time'): step([7], 2, captured=True)
    step([7], 2, captured=True); graph.replay(); synchronize(DEV)
    assert step.buffers.req_pool_indices_buf[:2].tolist() == [7, 0]


def test_a_leased_slots_lists_are_named_by_their_first_bad_entry():
    step, _ = _step(7)
    for rows, msg in (([1, 2.5], 'req_pool_indices[1] = 2.5'), ('ab', "req_pool_indices[0] = 'a'"), ([1, 2**31], 'req_pool_indices[1] = 2147483648')):
        with pytest.raises(ValueError, match=re.escape('req_pool_indices must hold int32 integers, got ' + msg)):
            step.decode_slot().put(rows)


def test_a_ring_bound_by_hand_to_larger_sizes_reads_nothing_past_the_tensors():
    "The kernel's bounds on the runtime tensors come with the tensors (its arguments), not from the header: a ring bound by hand to a pool far larger than the state's lets the planner pass a row past it, and the kernel still reads and writes nothing there."
    step, state = _step(8)
    step.ring.bind(lambda p: None, num_pool=2**30, fim_width=1, vocab_size=40)
    graph = capture(step.issue_captured, DEV)           # the bind made the engine's graph stale: captured again
    mem = [t.clone() for t in state]
    step([10**6, 5], 1, decode_input_ids=[3, -1], captured=True); graph.replay(); synchronize(DEV)
    b = step.buffers
    assert b.req_pool_indices_buf[:2].tolist() == [10**6, 5]
    assert b.seq_lens_buf[0].item() == 1                 # no cached length read for the row past the pool
    for k in (0, 1, 3): assert torch.equal(state[k], mem[k])   # cached lengths, input map (no override written), table
