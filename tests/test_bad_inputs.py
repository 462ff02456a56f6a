"""Bad inputs that would go wrong silently, each refused up front or named in debug mode, on every entry point it
applies to.

1. meta tensors (and any device the kernels cannot run on) are refused by kind, naming the argument and its device;
2. in debug mode, a KV slot or a sequence length that does not fit its int32 output is named;
3. contradictions the host can see are refused (a sliding ring narrower than one request's tokens, overlapping group
   outputs, an expanded table narrower than `ratio x width`), and where a length lives on the device, debug mode names it;
4. a mirror call's `stream` of the wrong kind is refused on every device;
5. a pool tensor whose storage was replaced after the mirror was built is refused, naming the tensor;
6. a prefill row whose positions (`extend_prefix_lens`) and KV slots (`valid_cache_lengths[pool]`) disagree is named
   in debug mode, and a chunk that ends past its request's prefill length is refused.
Every refusal happens before anything is written: the outputs keep their poison."""
import numpy as np
import pytest
import torch

from tokenspeed_lit.core.contract import device_value_checks, InputTypeError
from tokenspeed_lit.staging.positions import (compute_positions, compute_out_cache_loc, compute_positions_and_slots,
                                              compute_out_cache_loc_uniform, compute_out_cache_loc_sliding,
                                              compute_out_cache_loc_groups)
from tokenspeed_lit.staging.fused_decode import fused_decode_input_prep
from tokenspeed_lit.staging.page_tables import expand_page_table, DraftPageTable
from tokenspeed_lit.staging.input_buffers import InputBuffers, RuntimeStates
from tokenspeed_lit.staging.step_plan import ForwardOp
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.tiers.host_mirror import FlatHostMirror

from conftest import DEV, POISON

M = 'meta'


def _i(*v, dev=DEV, dtype=torch.int32):
    return torch.tensor(v, dtype=dtype, device=dev)


def _poisoned(n, dtype=torch.int32):
    return torch.full((n,), POISON, dtype=dtype, device=DEV)


def _table(rows=3, cols=4, dev=DEV):
    return (torch.arange(rows * cols, dtype=torch.int32, device=dev).view(rows, cols) + 1)


# ---- 1. meta tensors ------------------------------------------------------------------------------------------

def _meta(*v): return _i(*v, dev=M)


META_CALLS = [
    ('compute_positions', lambda: compute_positions(_meta(0), _meta(2), 2), 'extend_prefix_lens is on meta'),
    ('compute_positions out', lambda: compute_positions(_i(0), _i(2), 2, out=torch.empty(2, dtype=torch.int64, device=M)),
     'out is on meta'),
    ('compute_out_cache_loc', lambda: compute_out_cache_loc(_poisoned(2), _meta(1), _meta(2), _meta(0), _table(), 4),
     'req_pool_indices is on meta'),
    ('compute_out_cache_loc table', lambda: compute_out_cache_loc(_poisoned(2), _i(1), _i(2), _i(0), _table(dev=M), 4),
     'req_to_page is on meta'),
    ('compute_out_cache_loc out', lambda: compute_out_cache_loc(torch.empty(2, dtype=torch.int32, device=M), _i(1), _i(2),
                                                                _i(0), _table(), 4), 'out_cache_loc is on meta'),
    ('compute_positions_and_slots', lambda: compute_positions_and_slots(
        torch.empty(2, dtype=torch.int64, device=DEV), _poisoned(2), _i(0), _i(2), _i(0), _meta(1), _table(), 4, 2),
     'req_pool_indices is on meta'),
    ('uniform', lambda: compute_out_cache_loc_uniform(_poisoned(2), _i(1), 2, _meta(0), _table(), 4), 'cache_start is on meta'),
    ('sliding', lambda: compute_out_cache_loc_sliding(_poisoned(2), _meta(1), 2, _i(0), _table(), 4),
     'req_pool_indices is on meta'),
    ('groups', lambda: compute_out_cache_loc_groups([_poisoned(2)], _i(1), _i(2), _i(0), [_table(dev=M)], [4]),
     'req_to_pages[0] is on meta'),
    ('fused_decode_input_prep', lambda: fused_decode_input_prep(
        _poisoned(1), torch.empty(1, dtype=torch.int64, device=DEV), _poisoned(1), _meta(1),
        torch.zeros(3, dtype=torch.int32, device=M), 1, _table(dev=M), 4), 'req_pool_indices is on meta'),
    ('expand_page_table', lambda: expand_page_table(_table(dev=M), torch.empty(3, 8, dtype=torch.int32, device=DEV), 2),
     'table is on meta'),
    ('DraftPageTable', lambda: DraftPageTable(2, 8, 2, device=M), 'device is meta'),
    ('DraftPageTable.publish', lambda: DraftPageTable(4, 8, 2, device=DEV).publish(_table(dev=M)), 'table is on meta'),
    ('InputBuffers', lambda: InputBuffers(4, 16, 4, 0, 8, device=M), 'device is meta'),
    ('RuntimeStates', lambda: RuntimeStates(8, 1000, 2, device=M), 'device is meta'),
    ('FlatHostMirror', lambda: FlatHostMirror(PagedKVPool(3, 2, 1, 1, 2, device=M), 2), 'device_kv_pool is on meta'),
]


@pytest.mark.parametrize('name, call, msg', META_CALLS, ids=[c[0] for c in META_CALLS])
def test_meta_tensors_are_refused_by_name(name, call, msg):
    with pytest.raises(ValueError) as e: call()
    assert msg in str(e.value)


def test_a_bound_step_refuses_meta_runtime_state():
    ib = InputBuffers(4, 16, 4, 0, 8, device=DEV)
    rs = RuntimeStates(8, 1000, 2, device=DEV)
    rs.valid_cache_lengths = torch.zeros(9, dtype=torch.int32, device=M)
    with pytest.raises(ValueError, match='valid_cache_lengths is on meta'):
        ib.fill_input_buffers(ForwardOp([0], [3], [2]), rs, _table(9), 2)


# ---- 2. overflow named in debug mode --------------------------------------------------------------------------

BIG = 2**28                 # page 2**28 x page size 16: slot 2**32, past int32


def _big_table():
    return torch.tensor([[0, 0], [1, BIG]], dtype=torch.int32, device=DEV)


@pytest.mark.parametrize('name, call', [
    ('ragged', lambda out: compute_out_cache_loc(out, _i(1), _i(4), _i(14), _big_table(), 16)),
    ('positions_and_slots', lambda out: compute_positions_and_slots(torch.empty(4, dtype=torch.int64, device=DEV), out,
                                                                    _i(14), _i(4), _i(14), _i(1), _big_table(), 16, 4)),
    ('uniform', lambda out: compute_out_cache_loc_uniform(out, _i(1), 4, _i(14), _big_table(), 16)),
    ('groups', lambda out: compute_out_cache_loc_groups([out], _i(1), _i(4), _i(14), [_big_table()], [16])),
    ('fused_decode_input_prep', lambda out: fused_decode_input_prep(
        out, torch.empty(4, dtype=torch.int64, device=DEV), torch.empty(1, dtype=out.dtype, device=DEV), _i(1),
        _i(0, 14), 4, _big_table(), 16)),
])
def test_debug_mode_names_a_slot_past_int32(name, call):
    out = _poisoned(4)
    call(out)                                          # outside debug mode: memory-safe, the slot is the caller's problem
    with device_value_checks():
        out.fill_(POISON)
        with pytest.raises(ValueError, match=r'request 0: the KV slot of position 16 is 4294967296.*past the torch.int32'):
            call(out)
        assert (out == POISON).all(), f'{name}: wrote before refusing'
    wide = torch.full((4,), POISON, dtype=torch.int64, device=DEV)
    with device_value_checks(): call(wide)            # an int64 output holds it
    assert wide.tolist()[2] == BIG * 16


def test_debug_mode_names_a_sequence_length_past_int32():
    seq = _poisoned(1)
    call = lambda: fused_decode_input_prep(_poisoned(4), torch.empty(4, dtype=torch.int64, device=DEV), seq, _i(1),
                                           _i(0, 2**31 - 2), 4, _table(2, 4), 32)
    with device_value_checks():
        with pytest.raises(ValueError, match=r'request 0: valid_cache_lengths\[1\] \+ 4 = 2147483650, past the '
                                             r'torch.int32 range of seq_lens_out'):
            call()
    assert (seq == POISON).all()


def test_the_fused_step_names_a_sequence_length_past_int32():
    ib = InputBuffers(4, 16, 4, 0, 8, device=DEV)
    rs = RuntimeStates(8, 1000, 2, device=DEV)
    rs.valid_cache_lengths[3] = 2**31 - 2
    with device_value_checks():
        with pytest.raises(ValueError, match=r'request 0: valid_cache_lengths\[3\] \+ 2 = 2147483648'):
            ib.fill_input_buffers(ForwardOp([0], [3], [2]), rs, _table(9, 4), 2)


# ---- 3. contradictions ---------------------------------------------------------------------------------------

def test_a_sliding_ring_narrower_than_the_step_is_refused():
    out = _poisoned(9)
    with pytest.raises(ValueError, match=r'uniform_input_length=9 tokens of one request do not fit a ring of '
                                         r'req_to_page.shape\[1\]=2 pages x page_size=4'):
        compute_out_cache_loc_sliding(out, _i(1), 9, _i(0), _table(3, 2), 4)
    assert (out == POISON).all()
    compute_out_cache_loc_sliding(out[:8], _i(1), 8, _i(0), _table(3, 2), 4)     # exactly the ring: every slot once
    assert len(set(out[:8].tolist())) == 8


def test_a_ring_group_narrower_than_a_request_is_named_in_debug_mode():
    outs = [_poisoned(7), _poisoned(7)]
    call = lambda: compute_out_cache_loc_groups(outs, _i(1, 2), _i(2, 5), _i(0, 3), [_table(), _table()], [4, 2],
                                                [None, 2])
    call()
    with device_value_checks():
        with pytest.raises(ValueError, match=r'request 1: input_lengths\[1\] = 5 tokens do not fit the ring of group 1 '
                                             r'\(sliding_widths\[1\]=2 pages x page_sizes\[1\]=2\)'):
            call()


@pytest.mark.parametrize('views', ['same', 'overlap', 'overlap_reversed'])
def test_group_outputs_that_overlap_in_memory_are_refused(views):
    buf = _poisoned(12)
    a, b = {'same': (buf[:4], buf[:4]), 'overlap': (buf[:4], buf[3:7]), 'overlap_reversed': (buf[3:7], buf[:4])}[views]
    with pytest.raises(ValueError, match=r'out_cache_locs\[0\] and out_cache_locs\[1\] overlap in memory'):
        compute_out_cache_loc_groups([a, b], _i(1), _i(4), _i(0), [_table(), _table()], [4, 4])
    assert (buf == POISON).all()
    compute_out_cache_loc_groups([buf[:4], buf[4:8]], _i(1), _i(4), _i(0), [_table(), _table()], [4, 4])   # adjacent


# ---- 4 and 5. the mirror's calls -----------------------------------------------------------------------------

def _mirror():
    pool = PagedKVPool(num_pages=4, page_size=2, num_layers=2, num_kv_heads=1, head_dim=4, device=DEV)
    return pool, FlatHostMirror(pool, 3)


@pytest.mark.parametrize('stream', ['stream', 0, 7, object()])
@pytest.mark.parametrize('call', ['store_pages', 'load_pages', 'load_pages_with_events'])
@pytest.mark.parametrize('background', [False, True])
def test_a_mirror_stream_of_the_wrong_kind_is_refused(stream, call, background):
    _, m = _mirror()
    before = m.host_pages.clone()
    with pytest.raises(InputTypeError, match=f'stream must be a torch.cuda.Stream or None, got {type(stream).__name__}'):
        getattr(m, call)([(1, 0)], stream, background=background)
    assert torch.equal(m.host_pages, before)


@pytest.mark.parametrize('which', [0, 1, 3])
def test_replaced_pool_storage_is_refused_by_name(which):
    pool, m = _mirror()
    t = m.tensor_pairs[which][0]
    t.data = torch.zeros_like(t)                      # the views the mirror copies keep the old storage
    for call in (lambda: m.store_pages([(1, 0)]), lambda: m.load_pages([(1, 0)], background=True)):
        with pytest.raises(ValueError, match=rf'tensor {which} of the pool \(tensor_pairs\[{which}\]\) has new storage'):
            call()


# ---- 6. prefill rows ----------------------------------------------------------------------------------------

def _mixed(prefix=5, prefill_len=8, chunk=3):
    return ForwardOp([0, 1], [3, 4], [chunk, 2], input_ids=list(range(chunk)), shifted_input_ids=list(range(chunk)),
                     extend_prefix_lens=[prefix], prefill_lengths=[prefill_len], decode_input_ids=[-1])


def test_a_prefill_row_whose_positions_and_slots_disagree_is_named_in_debug_mode():
    ib = InputBuffers(4, 16, 4, 0, 8, device=DEV)
    rs = RuntimeStates(8, 1000, 2, device=DEV)
    rs.valid_cache_lengths[3] = 5
    table = _table(9, 4)
    ib.fill_input_buffers(_mixed(prefix=5), rs, table, 5)
    with device_value_checks():
        ib.fill_input_buffers(_mixed(prefix=5), rs, table, 5)                      # they agree: fine
        with pytest.raises(ValueError, match=r'prefill row 0: extend_prefix_lens\[0\] = 4 but valid_cache_lengths\[3\] '
                                             r'= 5: its positions would start at 4, its KV slots at 5'):
            ib.fill_input_buffers(_mixed(prefix=4, prefill_len=8), rs, table, 5)


def test_a_chunk_past_its_prefill_length_is_refused():
    ib = InputBuffers(4, 16, 4, 0, 8, device=DEV)
    rs = RuntimeStates(8, 1000, 2, device=DEV)
    before = ib.snapshot()
    with pytest.raises(ValueError, match=r'prefill row 0: extend_prefix_lens\[0\] \+ input_lengths\[0\] = 5 \+ 3 goes '
                                         r'past prefill_lengths\[0\] = 7'):
        ib.fill_input_buffers(_mixed(prefix=5, prefill_len=7), rs, _table(9, 4), 5)
    after = ib.snapshot()
    assert all(torch.equal(before[k], after[k]) for k in before)
