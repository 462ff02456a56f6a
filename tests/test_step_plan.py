"""The step planner (`tokenspeed_lit.staging.step_plan`), pure Python: the usual step's one test (`StepPlanner.plan`) and the
named checks (`plan_named`) give the same verdict on every step, valid or broken (the same refusal, word for word, or
plans that stage the same ints and return the same overrides); the back-to-back offsets, `staged_ints`, the all -1
rule, the plans of the other ways in (decode from lists, a leased slot, a dummy step) and their size refusals."""
import re
from types import SimpleNamespace
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tokenspeed_lit.staging import step_plan as sp
from tokenspeed_lit.staging.step_plan import (StepPlanner, StepPlan, ForwardOp, back_to_back, pool_error,
                                              staging_layout, write_lists, staged_ints, same_step, STEP_HEADER,
                                              LISTS_AT, MAMBA_FIELDS, PLAN_FIELDS, HEADER_FIELDS, LISTS, OVERRIDES,
                                              PACKING, MID_CHUNK, PLANNER, ONE_PACK, IDS_COPIED, BY_SECTION, WRITTEN)
from tokenspeed_lit.core.contract import InputTypeError

PURE = settings(max_examples=300)       # no kernels: many examples cost little
N = len(STEP_HEADER.groups['step'])     # a plan starts with the header's step fields


def V(plan):
    "A plan's fields by name (a plan is a plain tuple)."
    assert type(plan) is tuple and len(plan) == len(PLAN_FIELDS), plan
    return StepPlan(*plan)


# ---- plan against plan_named: the same verdict on every step --------------------------------------------------------

class Refused(tuple):
    "A refusal: its exception's type name and message."


def verdict(f, op, total, captured):
    "What the planner says of a step: the plan (its ints computed: a value that is not an int32 is refused by name when the step is staged), or the refusal."
    try:
        p = f(op, total, captured)
        V(p)
        staged_ints(p)
        return p
    except ValueError as e: return Refused((type(e).__name__, str(e)))


LIST_FORMS = {'list': list, 'tuple': tuple, 'int32': lambda v: np.array(v, dtype=np.int32),
              'int64': lambda v: np.array(v, dtype=np.int64), 'tensor': lambda v: torch.tensor(v, dtype=torch.int64)}


@st.composite
def planners(draw):
    max_bs = draw(st.sampled_from([1, 2, 4, 7, 140]))
    W = draw(st.integers(1, 3))
    max_tok = max_bs * W + draw(st.sampled_from([0, 3, 12]))
    num_pool = max(1, max_bs + draw(st.sampled_from([-1, 0, 2, 9])))
    return StepPlanner(max_bs, max_tok, W, num_pool, draw(st.booleans()))


def _spoil(draw, values, how):
    "`values` (a list of ints) with one entry made bad in the way `how` names (a copy)."
    v = list(values)
    if not v: return v
    i = draw(st.integers(0, len(v) - 1))
    v[i] = {'big': 2**31, 'small': -2**31 - 1, 'float': float(v[i]), 'bool': bool(v[i] % 2), 'none': None,
            'negative': -draw(st.integers(1, 5)), 'numpy int': np.int64(v[i])}[how]
    return v


_FAULTS = ('none', 'none', 'none', 'batch', 'request_ids', 'total', 'total type', 'decode length', 'prefill length',
           'pool dup', 'pool range', 'pool value', 'prefix', 'prefix value', 'chunk past', 'full', 'full value',
           'ids len', 'ids value', 'shifted len', 'overrides len', 'overrides value', 'mamba some', 'mamba len',
           'mamba value', 'stray prefill', 'captured', 'length value', 'namespace')


@st.composite
def steps(draw, planner, faults=_FAULTS):
    "A step for `planner`: mostly valid, decode or mixed, in the forms an engine gives; sometimes broken in one way (`faults`)."
    fault = draw(st.sampled_from(faults))
    W, top = planner.width, min(planner.max_bs, planner.num_pool)
    B = draw(st.integers(0, top) | st.sampled_from([top, 0, 1]))
    B = min(B, top)
    if fault == 'batch': B = planner.max_bs + draw(st.integers(1, 3))
    E = draw(st.sampled_from([0, B]) | st.integers(0, B))
    B = min(B, E + max(0, planner.max_num_tokens - E) // W) if fault != 'batch' else B
    budget = max(0, planner.max_num_tokens - (B - E) * W)
    pre = draw(st.lists(st.integers(0, max(0, min(5, budget // max(E, 1)))), min_size=E, max_size=E))
    if fault == 'prefill length' and E: pre = _spoil(draw, pre, 'negative')
    P = sum(max(0, n) for n in pre)
    lens = pre + [W] * (B - E)
    if fault == 'length value' and B:
        i = draw(st.integers(0, B - 1))
        lens[i] = draw(st.sampled_from([float(lens[i]), lens[i] + 0.5, bool(lens[i] % 2), None, np.int64(lens[i])]))
    if fault == 'decode length' and B > E: lens[draw(st.integers(E, B - 1))] = draw(st.sampled_from([0, W + 1, W - 1]))
    pools = (draw(st.permutations(range(planner.num_pool)))[:B] if B <= planner.num_pool
             else list(range(B)))
    if fault == 'pool dup' and B > 1:
        i, j = draw(st.lists(st.integers(0, B - 1), min_size=2, max_size=2, unique=True))
        pools[j] = pools[i]
    if fault == 'pool range' and B:
        pools[draw(st.integers(0, B - 1))] = draw(st.sampled_from([-1, planner.num_pool, planner.num_pool + 7, -2**31]))
    if fault == 'pool value': pools = _spoil(draw, pools, draw(st.sampled_from(['big', 'small', 'float', 'bool', 'none'])))
    prefix = draw(st.lists(st.integers(0, 6), min_size=E, max_size=E))
    if fault == 'prefix': prefix = _spoil(draw, prefix, 'negative')
    if fault == 'prefix value': prefix = _spoil(draw, prefix, draw(st.sampled_from(['float', 'bool', 'none', 'big'])))
    full = [max(0, p if isinstance(p, int) else 0) + max(0, n) + draw(st.integers(0, 2)) for p, n in zip(prefix, pre)]
    if fault == 'chunk past' and E:
        i = draw(st.integers(0, E - 1))
        full[i] = max(0, full[i] - draw(st.integers(1, 3)) - 2)
    if fault == 'full': full = full[:-1] if full and draw(st.booleans()) else full + [3]
    if fault == 'full value': full = _spoil(draw, full, draw(st.sampled_from(['float', 'bool', 'none'])))
    tok = st.integers(-3, 50)
    ids, shifted = (draw(st.lists(tok, min_size=P, max_size=P)) for _ in range(2))
    if fault == 'ids len': ids = ids + [1] if draw(st.booleans()) or not ids else ids[:-1]
    if fault == 'shifted len': shifted = shifted + [1] if draw(st.booleans()) or not shifted else shifted[:-1]
    if fault == 'ids value':
        ids = _spoil(draw, ids, draw(st.sampled_from(['big', 'small', 'float', 'bool', 'numpy int'])))
    D = B - E
    ovr = draw(st.sampled_from(['none', 'some', 'all -1']))
    ovr = None if ovr == 'none' else [-1] * D if ovr == 'all -1' else \
        draw(st.lists(st.just(-1) | st.integers(-3, 60), min_size=D, max_size=D))
    if fault == 'overrides len': ovr = (ovr or []) + [5] if draw(st.booleans()) or not ovr else ovr[:-1]
    if fault == 'overrides value' and ovr:
        ovr = _spoil(draw, ovr, draw(st.sampled_from(['big', 'small', 'float', 'bool'])))
    mamba = {}
    if fault.startswith('mamba') or draw(st.booleans()) and (planner.has_mamba or draw(st.integers(0, 5)) == 0):
        mamba = {f: draw(st.lists(st.integers(-1, 40), min_size=B, max_size=B)) for f in MAMBA_FIELDS}
        if fault == 'mamba some':
            for f in draw(st.lists(st.sampled_from(MAMBA_FIELDS), min_size=1, max_size=3, unique=True)): del mamba[f]
        if fault == 'mamba len':
            f = draw(st.sampled_from(MAMBA_FIELDS))
            mamba[f] = mamba[f] + [0] if draw(st.booleans()) or not mamba[f] else mamba[f][:-1]
        if fault == 'mamba value':
            f = draw(st.sampled_from(MAMBA_FIELDS))
            mamba[f] = _spoil(draw, mamba[f], draw(st.sampled_from(['big', 'float', 'bool'])))
    extra = {}
    if fault == 'stray prefill' and not E:
        extra = {draw(st.sampled_from(['input_ids', 'shifted_input_ids', 'prefill_lengths'])): [1, 2]}
    # forms: the engine's lists, or tuples, arrays, CPU tensors (only where every value is an int: an array cannot
    # hold a float or None without changing what is asked)
    def form(v, forms):
        if v is None or not all(type(x) is int for x in v): return v
        if not all(-2**31 <= x < 2**31 for x in v): forms = [f for f in forms if f != 'int32'] or ['list']
        return LIST_FORMS[draw(st.sampled_from(forms))](v)
    every = ['list', 'list', 'tuple', 'int32', 'int64', 'tensor']
    in32 = all(type(x) is not int or -2**31 <= x < 2**31 for x in pools)
    op = ForwardOp(list(range(B)), form(pools, every if in32 else ['list', 'tuple']), form(lens, every),
                   form(ids, ['list', 'list', 'int32', 'int64', 'tuple']), form(shifted, ['list', 'list', 'int32', 'int64']),
                   form(prefix, ['list', 'list', 'tuple', 'int32', 'tensor']), form(full, ['list', 'list', 'tuple', 'int64']),
                   form(ovr, ['list', 'list', 'tuple', 'int32']),
                   **{f: form(v, ['list', 'list', 'list', 'tuple', 'int32', 'int64']) for f, v in mamba.items()})
    for f, v in extra.items(): setattr(op, f, v)
    if fault == 'namespace':       # an object with the op's fields, some of those with defaults left out
        keep = vars(op).copy()
        for f in draw(st.lists(st.sampled_from(list(keep)[4:]), max_size=4, unique=True)): del keep[f]
        op = SimpleNamespace(**keep)
    if fault == 'request_ids':
        op.request_ids = draw(st.sampled_from([list(range(B + 1)), list(range(max(0, B - 1))), None, 5, tuple(range(B))]))
    total = P + D * W
    if fault == 'total': total = draw(st.sampled_from([total + 1, total - 1, -1, planner.max_num_tokens + 1]))
    if fault == 'total type': total = draw(st.sampled_from([float(total), True, np.int64(total), None, str(total)]))
    captured = draw(st.booleans()) if fault == 'captured' else draw(st.sampled_from([False, False, True])) and not E
    return op, total, captured


@PURE
@given(st.data())
def test_plan_and_plan_named_give_the_same_verdict(data):
    "The usual step's one test refuses what the named checks refuse, with their message, and plans what they plan."
    planner = data.draw(planners())
    op, total, captured = data.draw(steps(planner))
    fast, named = verdict(planner.plan, op, total, captured), verdict(planner.plan_named, op, total, captured)
    if type(named) is Refused: assert type(fast) is Refused and fast == named
    else:
        assert type(fast) is tuple, fast
        assert same_step(fast, named)
        assert staged_ints(fast) == staged_ints(named) and fast[HEADER_FIELDS] == named[HEADER_FIELDS]
        assert (fast[OVERRIDES], fast[MID_CHUNK]) == (named[OVERRIDES], named[MID_CHUNK])
        assert fast[PLANNER] is named[PLANNER] is planner


@PURE
@given(st.data())
def test_a_valid_step_is_planned_by_both_and_stages_what_it_says(data):
    "A step without a fault: both ways plan it; the plan stages the lists back to back in staging order, and returns the overrides unless all are -1."
    planner = data.draw(planners())
    op, total, captured = data.draw(steps(planner, ('none',)))
    p = verdict(planner.plan_named, op, total, captured)
    if type(p) is Refused:               # only Mamba lists to a planner without Mamba buffers
        assert p[1].endswith('but the buffers have no Mamba buffers (built with has_mamba=False)') and not planner.has_mamba
        return
    assert same_step(p, planner.plan(op, total, captured))
    p = V(p)
    B, E = len(op.request_ids), len(op.extend_prefix_lens)
    lens = list(np.asarray(op.input_lengths).tolist()) if B else []
    assert (p.batch, p.num_extends, p.prefill_tokens, p.width, p.total_tokens) == (B, E, sum(lens[:E]), planner.width, total)
    ovr = None if op.decode_input_ids is None else list(np.asarray(op.decode_input_ids).tolist())
    assert p.overrides == (None if ovr is None or ovr.count(-1) == len(ovr) else ovr)
    want = list(np.asarray(op.request_pool_indices).tolist()) if B else []
    want += ovr if p.has_override else []
    if p.has_mamba_data: want += [x for f in MAMBA_FIELDS for x in np.asarray(getattr(op, f)).tolist()]
    want += lens[:E] + (list(np.asarray(op.extend_prefix_lens).tolist()) if E else [])
    want += list(np.asarray(op.input_ids).tolist()) + list(np.asarray(op.shifted_input_ids).tolist()) if E else []
    assert list(staged_ints(p)[N:]) == want
    assert p.mid_chunk == (E > 0 and E == B and all(
        a + b < c for a, b, c in zip(np.asarray(op.extend_prefix_lens).tolist(), lens, np.asarray(op.prefill_lengths).tolist())))


# the verdicts the property above found to differ, each on its own (package bugs: see the messages)

def test_a_length_that_is_none_is_refused_by_name():
    "input_lengths holding None in a prefill row: a named refusal (a ValueError), not a bare TypeError from a comparison."
    planner = StepPlanner(4, 16, 2, 10, False)
    for op, total in ((ForwardOp([0], [1], [None], [], [], [0], [0]), 0),
                      (ForwardOp([0, 1], [1, 2], [None, 2], [], [], [0], [0]), 2)):
        for f in (planner.plan, planner.plan_named):
            with pytest.raises(ValueError, match='input_lengths'): f(op, total)


def test_a_float_length_of_a_decode_row_gets_one_verdict():
    "A mixed step whose decode row's length is 2.0 (the width, as a float): the usual test planned it, the named checks refuse it."
    planner = StepPlanner(4, 16, 2, 10, False)
    op = ForwardOp([0, 1], [1, 2], [1, 2.0], [5], [6], [0], [1])
    fast, named = verdict(planner.plan, op, 3, False), verdict(planner.plan_named, op, 3, False)
    assert type(fast) is type(named), (fast, named)          # (today: planned by one, refused by the other)
    assert fast == named if type(named) is Refused else same_step(fast, named)


@pytest.mark.parametrize('field', ['input_lengths', 'extend_prefix_lens'])
def test_a_float_in_a_prefill_row_gets_one_message(field):
    "A prefill row's length or prefix given as a float: both ways refuse it, with one message."
    planner = StepPlanner(4, 16, 2, 10, False)
    kw = dict(request_ids=[0], request_pool_indices=[1], input_lengths=[2], input_ids=[5, 6], shifted_input_ids=[6, 7],
              extend_prefix_lens=[0], prefill_lengths=[2])
    kw[field] = [float(kw[field][0])]
    op = ForwardOp(**kw)
    fast, named = verdict(planner.plan, op, 2, False), verdict(planner.plan_named, op, 2, False)
    assert type(named) is Refused and fast == named


# ---- the pieces --------------------------------------------------------------------------------------------------

@given(B=st.integers(0, 6), E=st.integers(0, 6), P=st.integers(0, 9), ovr=st.booleans(), mamba=st.booleans())
def test_back_to_back_offsets(B, E, P, ovr, mamba):
    "Each list starts where the one before ends, from LISTS_AT on, in staging order; `staged` is where the last ends."
    E = min(E, B)
    pools, prefix, lens = list(range(B)), [0] * E, [1] * E
    o = [7] * (B - E) if ovr and B > E else None
    m = tuple([k] * B for k in range(4)) if mamba else None
    ids = list(range(P))
    plan = back_to_back(None, pools, o, m, lens, prefix, ids, ids, 2, P + 2 * (B - E))
    p = V(plan)
    assert p.s_pool == LISTS_AT == STEP_HEADER.at['ticket'] + 1
    assert p.s_override == p.s_pool + B
    assert p.s_mamba == p.s_override + (B - E if o is not None else 0)
    assert p.mamba_stride == B
    assert p.s_lengths == p.s_mamba + (4 * B if mamba else 0)
    assert p.s_extend_prefix == p.s_lengths + E and p.s_ids == p.s_extend_prefix + E
    assert p.shifted_at == p.s_ids + P and p.staged == p.shifted_at + P
    assert (p.has_override, p.has_mamba_data) == (o is not None, mamba)
    assert plan[HEADER_FIELDS] == tuple(p)[:N] == tuple(getattr(p, f) for f in STEP_HEADER.groups['step'])
    assert PLAN_FIELDS[:N] == StepPlan._fields[:N] == STEP_HEADER.groups['step']
    assert plan[LISTS] == (pools, () if o is None else o, *(m or ((),) * 4), lens, prefix, ids, ids)
    assert (plan[PACKING], plan[MID_CHUNK], plan[PLANNER]) == (ONE_PACK, False, None)
    a = np.full(p.staged + 5, -9, np.int32)
    write_lists(plan, a)
    want = pools + (o or []) + [x for v in (m or ()) for x in v] + lens + prefix + ids + ids
    assert a[LISTS_AT:p.staged].tolist() == want and (a[p.staged:] == -9).all() and (a[:LISTS_AT] == -9).all()
    assert staged_ints(plan) == plan[HEADER_FIELDS] + tuple(want)


@given(B=st.integers(0, 5), ovr=st.booleans(), mamba=st.booleans(), width=st.integers(1, 3), dummy=st.integers(0, 4),
       seq=st.integers(1, 3), T=st.integers(0, 20))
def test_a_header_follows_from_the_sizes(B, ovr, mamba, width, dummy, seq, T):
    "A step without prefill rows has the header of its sizes whatever its rows hold: the lists back to back after the ring's fields, the caller's own lists behind them."
    o = [5] * B if ovr and B else None
    m = tuple([k] * B for k in range(4)) if mamba else None
    rows = (list(range(B)), list(range(10, 10 + B)))
    plans = [back_to_back(None, pools, o, m, (), (), (), (), width, T, dummy_rows=dummy, dummy_seq_len=seq)
             for pools in rows]
    assert plans[0][HEADER_FIELDS] == plans[1][HEADER_FIELDS]
    v = V(plans[0])
    assert (v.batch, v.width, v.total_tokens, v.dummy_rows, v.dummy_seq_len) == (B, width, T, dummy, seq)
    assert (v.s_pool, v.s_override, v.s_mamba) == (LISTS_AT, LISTS_AT + B, LISTS_AT + B + (B if o else 0))
    assert v.staged == LISTS_AT + B * (1 + bool(o) + 4 * bool(m)) == v.s_lengths
    for plan, pools in zip(plans, rows): assert plan[LISTS][0] is pools and plan[OVERRIDES] is o


def test_the_all_minus_one_rule():
    "Overrides that are all -1 are none: no section, no flag, `None` returned; one that is not -1 keeps them all."
    none = back_to_back(None, [3, 5], [-1, -1], None, (), (), (), (), 1, 2)
    v = V(none)
    assert (v.overrides, v.has_override, v.s_mamba - v.s_override, v.decode_input_ids) == (None, False, 0, ())
    assert same_step(none, back_to_back(None, [3, 5], None, None, (), (), (), (), 1, 2))
    some = back_to_back(None, [3, 5], [-1, 4], None, (), (), (), (), 1, 2)
    v = V(some)
    assert (v.overrides, v.has_override, v.staged - v.s_override) == ([-1, 4], True, 2)
    assert not same_step(some, none)
    assert back_to_back(None, [], [], None, (), (), (), (), 1, 0)[OVERRIDES] is None   # no decode rows: none either
    planner = StepPlanner(4, 16, 2, 10, False)
    for f in (planner.plan, planner.plan_named):
        assert f(ForwardOp([0, 1], [1, 2], [2, 2], decode_input_ids=[-1, -1]), 4)[OVERRIDES] is None
        assert f(ForwardOp([0, 1], [1, 2], [2, 2], decode_input_ids=(-1, -1)), 4)[OVERRIDES] is None
        assert f(ForwardOp([0, 1], [1, 2], [2, 2], decode_input_ids=[-1, 3]), 4)[OVERRIDES] == [-1, 3]
        assert f(ForwardOp([0, 1], [1, 2], [1, 2], [5], [6], [0], [1], decode_input_ids=[-1]), 3)[OVERRIDES] is None
    assert planner.decode([1, 2], 2, [-1, -1])[OVERRIDES] is None
    assert planner.decode((1, 2), 2, np.array([-1, 6]))[OVERRIDES] == [-1, 6]


def test_plans_compare_by_what_they_stage():
    planner = StepPlanner(4, 16, 2, 10, True)
    op = ForwardOp(['p', 'a'], [3, 5], [4, 2], [1, 2, 3, 4], [2, 3, 4, 5], [2], [10], [77])
    p = planner.plan(op, 6)
    for form in (tuple, lambda v: np.array(v, dtype=np.int32), lambda v: np.array(v), torch.tensor):
        q = planner.plan_named(ForwardOp(['p', 'a'], form([3, 5]), form([4, 2]), form([1, 2, 3, 4]),
                                         form([2, 3, 4, 5]), [2], [10], [77]), 6)
        assert same_step(q, p) and same_step(p, q)
    assert p[PACKING] == ONE_PACK
    assert planner.plan(ForwardOp(['p', 'a'], [3, 5], [4, 2], np.array([1, 2, 3, 4], np.int32),
                                  np.array([2, 3, 4, 5], np.int32), [2], [10], [77]), 6)[PACKING] == IDS_COPIED
    assert planner.plan_named(ForwardOp(['p', 'a'], np.array([3, 5]), [4, 2], [1, 2, 3, 4], [2, 3, 4, 5], [2], [10],
                                        [77]), 6)[PACKING] == BY_SECTION
    assert not same_step(p, planner.plan(ForwardOp(['p', 'a'], [3, 5], [4, 2], [1, 2, 3, 4], [2, 3, 4, 5], [2], [10], [78]), 6))
    assert not same_step(p, planner.plan(ForwardOp(['p', 'a'], [3, 5], [4, 2], [1, 2, 3, 4], [2, 3, 4, 5], [2], [6]), 6))
    last = ForwardOp(['p', 'a'], [3, 5], [4, 2], [1, 2, 3, 4], [2, 3, 4, 5], [6], [10], [77])   # the chunk ends its prompt
    assert planner.plan(ForwardOp(['p'], [3], [4], [1, 2, 3, 4], [2, 3, 4, 5], [2], [10]), 4)[MID_CHUNK] is True
    assert planner.plan(last, 6)[MID_CHUNK] is False
    assert 'StepPlanner(max_bs=4' in repr(planner) and 'batch=2' in repr(V(p))


def test_staged_ints_of_a_step_with_a_value_that_is_not_int32_names_the_list():
    planner = StepPlanner(4, 16, 2, 10, True)
    p = planner.plan(ForwardOp([0, 1], [1, 2], [2, 2], decode_input_ids=[5, 2**31]), 4)    # planned: checked when staged
    with pytest.raises(ValueError, match=re.escape('decode_input_ids must hold int32 integers, got decode_input_ids[1] = 2147483648')):
        staged_ints(p)
    p = planner.plan(ForwardOp([0, 1], [1, 2], [2, 2], mamba_pool_indices=[0, 1.5], mamba_cow_src_indices=[0, 1],
                               mamba_branching_seqlens=[0, 1], mamba_track_pool_indices=[0, 1]), 4)
    with pytest.raises(ValueError, match=re.escape('mamba_pool_indices must hold int32 integers, got mamba_pool_indices[1] = 1.5')):
        staged_ints(p)


# ---- the other ways in: decode from lists, a leased slot, a dummy step ---------------------------------------------

def test_decode_plans():
    planner = StepPlanner(4, 8, 2, 10, True)
    plan = planner.decode([4, 7], 1, decode_input_ids=[-1, 9])
    d = V(plan)
    assert (d.batch, d.num_extends, d.width, d.total_tokens, d.overrides, d.pool_name, d.packing) == \
        (2, 0, 1, 2, [-1, 9], 'req_pool_indices', ONE_PACK)
    assert staged_ints(plan)[N:] == (4, 7, -1, 9)
    m = planner.decode(np.array([4, 7]), 2, mamba=([1, 2], [3, 4], [5, 6], [7, 8]))
    assert (V(m).has_mamba_data, V(m).packing, V(m).mamba_stride) == (True, BY_SECTION, 2)
    assert staged_ints(m)[N:] == (4, 7, 1, 2, 3, 4, 5, 6, 7, 8)
    assert same_step(m, planner.decode([4, 7], 2, mamba=[[1, 2], [3, 4], [5, 6], [7, 8]]))
    e = V(planner.decode([], 2))
    assert (e.batch, e.width, e.total_tokens, e.staged) == (0, 0, 0, LISTS_AT)
    assert V(planner.decode([4, 7], 2, name='x')).pool_name == 'x'
    assert planner.decode([4, 7], 2)[PLANNER] is planner


def test_leased_plans():
    planner = StepPlanner(4, 8, 2, 10, True)
    lay = planner.layout
    assert lay == staging_layout(4, 8)
    plan = planner.leased(3, 2, overrides=True)
    l = V(plan)
    assert (l.batch, l.width, l.total_tokens, l.has_override, l.has_mamba_data, l.packing) == (3, 2, 6, True, False, WRITTEN)
    assert (l.s_pool, l.s_override, l.s_mamba, l.mamba_stride, l.staged) == \
        (lay['pool'], lay['override'], lay['mamba'], 4, lay['mamba'])
    assert plan[LISTS] == ((),) * 10 and l.overrides is None and plan[PLANNER] is planner
    assert V(planner.leased(3, 2, mamba=True)).staged == lay['lengths']
    z = V(planner.leased(0, 7))                             # no rows: the width is not looked at, nothing staged
    assert (z.batch, z.width, z.total_tokens, z.staged) == (0, 0, 0, STEP_HEADER.size)
    assert V(planner.leased(np.int64(2), 1)).batch == 2     # the named way accepts numpy integers
    assert staged_ints(plan) == plan[HEADER_FIELDS] + (0,) * (l.staged - LISTS_AT)   # the scheduler writes the rows


def test_dummy_plans():
    planner = StepPlanner(4, 8, 2, 10, False)
    u = V(planner.dummy(3, 6))
    assert (u.batch, u.dummy_rows, u.dummy_seq_len, u.staged, u.total_tokens) == (0, 3, 2, LISTS_AT, 0)
    assert V(planner.dummy(0, 0)).dummy_rows == 0 and V(planner.dummy(4, 0)).dummy_seq_len == 1


_SIZE_REFUSALS = [   # (call on StepPlanner(4, 8, 2, 10, has_mamba=False), exception, message)
    (lambda p: p.decode_sizes(5, 1), ValueError, 'batch of 5 requests is larger than max_bs=4'),
    (lambda p: p.decode_sizes(2, 3), ValueError, 'uniform_input_length must be an integer in [1, 2] (the width of future_input_map), got 3'),
    (lambda p: p.decode_sizes(2, 0), ValueError, 'uniform_input_length must be an integer in [1, 2]'),
    (lambda p: p.decode_sizes(2, 1.0), InputTypeError, 'uniform_input_length must be an integer, got 1.0'),
    (lambda p: p.decode_sizes(2, True), InputTypeError, 'uniform_input_length must be an integer, got True'),
    (lambda p: StepPlanner(4, 6, 2, 10, False).decode_sizes(4, 2), ValueError, '4 x 2 tokens exceed max_num_tokens=6'),
    (lambda p: p.decode([1, 2], 3), ValueError, 'uniform_input_length must be an integer in [1, 2]'),
    (lambda p: p.decode([1, 2, 3, 4, 5], 1), ValueError, 'batch of 5 requests is larger than max_bs=4'),
    (lambda p: p.decode([1, 10], 1), ValueError, 'req_pool_indices holds 10, outside the pool [0, 10)'),
    (lambda p: p.decode([1, 1], 1), ValueError, 'req_pool_indices holds pool row 1 twice (requests 0 and 1)'),
    (lambda p: p.decode([1, 2], 1, [5]), ValueError, 'decode_input_ids has 1 entries for 2 decode rows'),
    (lambda p: p.decode([1, 2], 1, mamba=[[0, 0]] * 4), ValueError, 'mamba_pool_indices given, but the buffers have no Mamba buffers'),
    (lambda p: StepPlanner(4, 8, 2, 10, True).decode([1, 2], 1, mamba=[[0, 0]] * 3), ValueError, 'mamba must be the 4 Mamba index lists'),
    (lambda p: StepPlanner(4, 8, 2, 10, True).decode([1, 2], 1, mamba='abcd'), ValueError, 'mamba must be the 4 Mamba index lists'),
    (lambda p: StepPlanner(4, 8, 2, 10, True).decode([1, 2], 1, mamba=[[0, 0]] * 3 + [[0]]), ValueError,
     'mamba_track_pool_indices: 1 entries'),
    (lambda p: p.decode({1, 2}, 1), InputTypeError, 'req_pool_indices must be a list, tuple, numpy array or CPU tensor'),
    (lambda p: p.decode(np.array([1, 2**40]), 1), ValueError, 'req_pool_indices must hold int32 integers, got 1..1099511627776'),
    (lambda p: p.leased(5, 1), ValueError, 'batch of 5 requests is larger than max_bs=4'),
    (lambda p: p.leased(-1, 1), ValueError, 'batch must be an integer >= 0'),
    (lambda p: p.leased(2.0, 1), InputTypeError, 'batch must be an integer, got 2.0'),
    (lambda p: p.leased(2, 3), ValueError, 'uniform_input_length must be an integer in [1, 2]'),
    (lambda p: p.leased(2, 1, overrides=1), InputTypeError, 'overrides must be True or False'),
    (lambda p: p.leased(2, 1, mamba=None), InputTypeError, 'mamba must be True or False'),
    (lambda p: p.leased(2, 1, mamba=True), ValueError, 'mamba=True, but the buffers have no Mamba buffers'),
    (lambda p: p.dummy(5, 1), ValueError, 'batch_size must be an integer in [0, 4], got 5'),
    (lambda p: p.dummy(-1, 1), ValueError, 'batch_size must be an integer in [0, 4], got -1'),
    (lambda p: p.dummy(2, 9), ValueError, 'total_tokens must be an integer in [0, 8], got 9'),
    (lambda p: p.dummy(2.0, 1), InputTypeError, 'batch_size must be an integer, got 2.0'),
    (lambda p: p.check_batch(5), ValueError, 'batch of 5 requests is larger than max_bs=4'),
]


@pytest.mark.parametrize('call, exc, msg', _SIZE_REFUSALS)
def test_size_refusals(call, exc, msg):
    with pytest.raises(exc, match=re.escape(msg)): call(StepPlanner(4, 8, 2, 10, False))


def test_decode_sizes():
    p = StepPlanner(4, 8, 2, 10, False)
    assert [p.decode_sizes(0, 99), p.decode_sizes(3, 2), p.decode_sizes(4, np.int64(1))] == [0, 2, 1]
    assert type(p.decode_sizes(4, np.int64(1))) is int


# ---- check_pools and pool_error: the builtins (up to _BUILTIN_ROWS rows) and numpy --------------------------------

def _pools_error_ref(rows, num_pool, name='req_pool_indices'):
    bad = [r for r in rows if not 0 <= r < num_pool]
    if bad: return f'{name} holds {bad[0]}, outside the pool [0, {num_pool})'
    for j, r in enumerate(rows):
        if r in rows[:j]: return f'{name} holds pool row {r} twice (requests {rows.index(r)} and {j})'
    return None


@PURE
@given(batch=st.integers(0, 300) | st.sampled_from([1, sp._BUILTIN_ROWS, sp._BUILTIN_ROWS + 1]),
       num_pool=st.sampled_from([1, 7, 300, 600]), kind=st.sampled_from(['ok', 'dup', 'neg', 'high']),
       array=st.booleans(), data=st.data())
def test_check_pools_on_both_paths(batch, num_pool, kind, array, data):
    batch = min(batch, num_pool) if kind == 'ok' else max(batch, 2 if kind == 'dup' else 1)
    rows = data.draw(st.permutations(range(num_pool)))[:batch] if kind == 'ok' else \
        data.draw(st.lists(st.integers(0, num_pool - 1), min_size=batch, max_size=batch))
    if kind != 'ok':
        at = data.draw(st.integers(0, len(rows) - 1))
        rows[at] = {'dup': rows[at - 1] if at else rows[-1], 'neg': -data.draw(st.integers(1, 2**31)),
                    'high': data.draw(st.integers(num_pool, 2**31 - 1))}[kind]
    planner = StepPlanner(302, 302, 1, num_pool, False)
    arg = np.array(rows, dtype=np.int32) if array else rows
    want = _pools_error_ref(rows, num_pool)
    if want is None: planner.check_pools(arg, 'req_pool_indices')
    else:
        with pytest.raises(ValueError, match=re.escape(want)): planner.check_pools(arg, 'req_pool_indices')
    planner.check_pools([0] if num_pool else [])          # the numpy path's scratch leaves no trace behind


@pytest.mark.parametrize('rows, msg', [
    ([1, True], 'must hold int32 integers, got True'),
    ([1, 2.0], 'must hold int32 integers, got 2.0'),
    ([1, None], 'must hold int32 integers, got None'),
    ([1, 2**31], 'must hold int32 integers, got 2147483648'),
    ([3, 1, 3], 'holds pool row 3 twice (requests 0 and 2)'),
    (np.array([3, -1, 3]), 'holds -1, outside the pool [0, 8)'),
])
def test_pool_error(rows, msg):
    with pytest.raises(ValueError, match=re.escape(msg)): pool_error(rows, 8, 'p')
