"""The input contract (`contract`), case by case, where a call could break it: writes outside the output,
garbage past the requests, narrow outputs, duplicate pool rows, silently dropped lists, unhelpful errors, work that
followed the values instead of the output size, and the debug mode switched on from the environment."""
import os, subprocess, sys, time
import numpy as np
import pytest
import torch

from tokenspeed_lit.core.device import default_device
from tokenspeed_lit.core.streams import synchronize
from tokenspeed_lit.core.contract import InputTypeError
from tokenspeed_lit.staging.positions import compute_positions, compute_out_cache_loc
from tokenspeed_lit.staging.step_plan import ForwardOp
from tokenspeed_lit.staging.input_buffers import RuntimeStates, InputBuffers
from tokenspeed_lit.tiers.kv_pool import PagedKVPool
from tokenspeed_lit.tiers.host_mirror import FlatHostMirror

DEV = default_device()
POISON = -999


def test_negative_lengths_in_the_first_block_write_nothing_outside():
    buf = torch.full((40,), POISON, dtype=torch.int64, device=DEV)
    lens = torch.tensor([-24, 3, -1, 2], dtype=torch.int32, device=DEV)
    pos, start = compute_positions(torch.tensor([0, 10, 0, 20], device=DEV), lens, 5, out=buf[10:15])
    assert pos.tolist() == [10, 11, 12, 20, 21] and start.tolist() == [0, 0, 3, 3]
    assert (buf[:10] == POISON).all() and (buf[15:] == POISON).all()
    loc = torch.full((40,), POISON, dtype=torch.int32, device=DEV)
    table = torch.arange(1, 9, dtype=torch.int32, device=DEV).view(4, 2)
    compute_out_cache_loc(loc[10:16], torch.tensor([0, 1, 2, 3], device=DEV), lens, torch.zeros(4, device=DEV,
                          dtype=torch.int32), table, 4, dummy_slot=7)
    assert loc[10:16].tolist() == [12, 13, 14, 28, 29, 7]
    assert (loc[:10] == POISON).all() and (loc[16:] == POISON).all()


def test_total_tokens_above_the_sum_is_padding_not_garbage():
    out = torch.full((8,), POISON, dtype=torch.int64, device=DEV)
    pos, _ = compute_positions(torch.tensor([4], device=DEV), torch.tensor([2], device=DEV), 6, out=out)
    assert pos.tolist() == [4, 5, 0, 0, 0, 0]
    pos, _ = compute_positions(torch.zeros(0, dtype=torch.int32, device=DEV),
                               torch.zeros(0, dtype=torch.int32, device=DEV), 5, out=out)
    assert pos.tolist() == [0] * 5


@pytest.mark.parametrize('dtype', [torch.int16, torch.int8, torch.uint8])
def test_narrow_outputs_are_refused(dtype):
    one = torch.ones(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match='must be int'):
        compute_positions(one, one, 1, out=torch.empty(1, dtype=dtype, device=DEV))
    with pytest.raises(ValueError, match='out_cache_loc must be int32 or int64'):
        compute_out_cache_loc(torch.empty(1, dtype=dtype, device=DEV), one, one, one, one.view(1, 1), 4)


def _buffers(**kw):
    rs = RuntimeStates(8, 1000, 2, device=DEV)
    table = torch.arange(9 * 4, dtype=torch.int32, device=DEV).view(9, 4) + 1
    return InputBuffers(4, 16, 4, 0, 8, device=DEV, **kw), rs, table


def test_duplicate_pool_rows_are_refused():
    ib, rs, table = _buffers()
    with pytest.raises(ValueError, match='pool row 3 twice'):
        ib.fill_input_buffers(ForwardOp([0, 1], [3, 3], [2, 2], decode_input_ids=[5, 6]), rs, table, 4)


def test_lists_the_configuration_cannot_use_are_refused():
    ib, rs, table = _buffers()
    with pytest.raises(ValueError, match='no Mamba buffers'):
        ib.fill_input_buffers(ForwardOp([0], [3], [2], mamba_pool_indices=[1], mamba_cow_src_indices=[1],
                                        mamba_branching_seqlens=[1], mamba_track_pool_indices=[1]), rs, table, 2)
    with pytest.raises(ValueError, match='no prefill row'):
        ib.fill_input_buffers(ForwardOp([0], [3], [2], input_ids=[7, 8]), rs, table, 2)


@pytest.mark.parametrize('build', ['InputBuffers', 'FusedDecodeStep.create', 'PaddedBuffers', 'padding_values'])
@pytest.mark.parametrize('field,value', [('state_write_padding_pool_index', -1), ('state_write_padding_pool_index', -3),
                                         ('dummy_kv_slot', -1), ('state_write_padding_pool_index', 2**31)])
def test_padding_rows_and_slots_must_be_indices(build, field, value):
    "The state row and KV slot the padded rows write are indices: a negative one (torch reads -1 as the last row, a "
    "live request's) or one past the int32 header is refused by name, however the buffers are built."
    from tokenspeed_lit.staging.fused_decode import FusedDecodeStep
    from tokenspeed_lit.staging.padding import PaddedBuffers, padding_values
    kw = {'dummy_kv_slot': 0, 'state_write_padding_pool_index': 0, field: value}
    calls = {'InputBuffers': lambda: InputBuffers(4, 16, 4, device=DEV, has_mamba=True, **kw),
             'FusedDecodeStep.create': lambda: FusedDecodeStep.create(4, 16, 4, device=DEV, has_mamba=True, **kw),
             'PaddedBuffers': lambda: PaddedBuffers(4, 16, device=DEV, has_mamba=True, **kw),
             'padding_values': lambda: padding_values(**kw)}
    with pytest.raises(ValueError, match=rf'{field} must be an integer in \[0, 2147483647\], got {value}'):
        calls[build]()


def test_numpy_lists_work_and_bad_types_are_named():
    ib, rs, table = _buffers()
    assert ib.fill_input_buffers(ForwardOp([0, 1], np.array([3, 4]), np.array([2, 2]),
                                           decode_input_ids=np.array([5, -1])), rs, table, 4) == [5, -1]
    with pytest.raises(InputTypeError, match='batch_size must be an integer, got 2.0'):
        ib.fill_dummy_decode_buffers(2.0, 4)
    with pytest.raises(ValueError, match='input_lengths\\[0\\] = -1'):
        ib.fill_input_buffers(ForwardOp([0], [3], [-1], extend_prefix_lens=[0], prefill_lengths=[1]), rs, table, 0)
    m = FlatHostMirror(PagedKVPool(3, 2, 1, 1, 2, device=DEV), 2)
    for pairs, msg in [([1, 0], 'pairs[0] = 1'), ([(1, 0), (2,)], 'pairs[1] = (2,)')]:
        with pytest.raises(ValueError, match=msg.replace('[', '\\[').replace(']', '\\]').replace('(', '\\(')
                           .replace(')', '\\)')):
            m.store_pages(pairs)


def test_work_follows_the_output_not_the_lengths():
    t0 = time.perf_counter()
    pos, _ = compute_positions(torch.tensor([0], device=DEV), torch.tensor([10**6], device=DEV), 4)
    synchronize(DEV)
    assert pos.tolist() == [0, 1, 2, 3] and time.perf_counter() - t0 < 5


def test_debug_mode_from_the_environment():
    code = ('import torch\nfrom tokenspeed_lit.core import contract, device\nfrom tokenspeed_lit.staging.positions import compute_positions\n'
            'print(contract.CHECK_DEVICE_VALUES)\nd = device.default_device()\n'
            'try: compute_positions(torch.tensor([0], device=d), torch.tensor([-2], device=d), 1)\n'
            'except ValueError as e: print(e)\n')
    env = {k: v for k, v in os.environ.items() if k != 'TOKENSPEED_LIT_CHECK'}
    on = subprocess.run([sys.executable, '-c', code], env={**env, 'TOKENSPEED_LIT_CHECK': '1'}, capture_output=True,
                        text=True, timeout=120)
    assert on.stdout.splitlines() == ['True', 'request 0: extend_seq_lens[0] = -2, must be >= 0'], on.stdout + on.stderr
    off = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=120)
    assert off.stdout.splitlines() == ['False'], off.stdout + off.stderr
