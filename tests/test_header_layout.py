"""The header declaration refuses, where it is made, what it could not serve: a group that is not a tuple or list of
names, a field name the offsets, the writers or `HEADER(...)` could not read back as itself, and a size that is not a
positive int. Each refusal names the bad group, field or size."""
import re
import numpy as np
import pytest
from tokenspeed_lit.staging.header_layout import HeaderLayout, HEADER

# (size, groups, error type, text the message must hold: the bad thing named, and why)
BAD = [
    (8, dict(step=('batch')), TypeError, "group 'step' must be a tuple or list of field names, not str 'batch'"),
    (8, dict(step='', ring=('t',)), TypeError, "group 'step' must be a tuple or list of field names, not str ''"),
    (8, dict(step={'a', 'b'}), TypeError, "group 'step' must be a tuple or list of field names, not set"),
    (8, dict(step=(n for n in ('a', 'b'))), TypeError, "group 'step' must be a tuple or list of field names, not generator"),
    (8, dict(step={'a': 1}), TypeError, "group 'step' must be a tuple or list of field names, not dict"),
    (8, dict(ring=None), TypeError, "group 'ring' must be a tuple or list of field names, not NoneType"),
    (8, dict(step=b'ab'), TypeError, "group 'step' must be a tuple or list of field names, not bytes"),
    (8, dict(step=range(2)), TypeError, "group 'step' must be a tuple or list of field names, not range"),
    (8, dict(step=('batch', 'value')), ValueError, "'value' of group 'step' is an attribute of the offsets object"),
    (8, dict(ring=('type',)), ValueError, "'type' of group 'ring' is an attribute of the offsets object"),
    (8, dict(step=('count',)), ValueError, "'count' of group 'step' is an attribute of the offsets object"),
    (8, dict(step=('index',)), ValueError, "'index' of group 'step' is an attribute of the offsets object"),
    (8, dict(step=('logical_and',)), ValueError, "'logical_and' of group 'step' is an attribute of the offsets object"),
    (8, dict(step=('logical_or',)), ValueError, "'logical_or' of group 'step' is an attribute of the offsets object"),
    (8, dict(step=('_fields',)), ValueError, "'_fields' of group 'step' starts with an underscore"),
    (8, dict(step=('_asdict',)), ValueError, "'_asdict' of group 'step' starts with an underscore"),
    (8, dict(step=('_x',)), ValueError, "'_x' of group 'step' starts with an underscore"),
    (8, dict(step=('__class__',)), ValueError, "'__class__' of group 'step' starts with an underscore"),
    (8, dict(step=('batch', 'm')), ValueError, "'m' of group 'step' is the generated writer's own parameter"),
    (8, dict(step=('if',)), ValueError, "'if' of group 'step' is a Python keyword"),
    (8, dict(step=('None',)), ValueError, "'None' of group 'step' is a Python keyword"),
    (8, dict(step=('a b',)), ValueError, "'a b' of group 'step' is not a Python identifier"),
    (8, dict(step=('',)), ValueError, "'' of group 'step' is not a Python identifier"),
    (8, dict(step=('1a',)), ValueError, "'1a' of group 'step' is not a Python identifier"),
    (8, dict(step=('a.b',)), ValueError, "'a.b' of group 'step' is not a Python identifier"),
    (8, dict(step=('\ufb01eld',)), ValueError, "'\ufb01eld' of group 'step' is not a Python identifier"),  # reads back as 'field'
    (8, dict(step=(1,)), TypeError, "field 1 of group 'step' is not a str but int"),
    (8, dict(step=(None,)), TypeError, "field None of group 'step' is not a str but NoneType"),
    (8, dict(step=(b'ab',)), TypeError, "field b'ab' of group 'step' is not a str but bytes"),
    (8, dict(step=(('a',),)), TypeError, "field ('a',) of group 'step' is not a str but tuple"),
    (8, dict(step=('a', 'b'), ring=('a',)), ValueError, "header fields declared twice: ['a']"),
    (8, dict(step=('a', 'b', 'b')), ValueError, "header fields declared twice: ['b']"),
    (2, dict(step=('x', 'y', 'z')), ValueError, '3 header fields do not fit 2 ints'),
    (2.5, dict(step=('a',)), TypeError, 'the header size must be a positive int, not 2.5 (float)'),
    (8.0, dict(step=('a',)), TypeError, 'the header size must be a positive int, not 8.0 (float)'),
    (True, dict(step=('a',)), TypeError, 'the header size must be a positive int, not True (bool)'),
    (False, dict(), TypeError, 'the header size must be a positive int, not False (bool)'),
    (np.bool_(True), dict(), TypeError, 'the header size must be a positive int, not'),
    ('8', dict(step=('a',)), TypeError, "the header size must be a positive int, not '8' (str)"),
    (None, dict(), TypeError, 'the header size must be a positive int, not None (NoneType)'),
    (np.float64(8), dict(), TypeError, 'the header size must be a positive int, not'),
    (0, dict(), ValueError, 'the header size must be a positive int, not 0'),
    (-1, dict(step=('a',)), ValueError, 'the header size must be a positive int, not -1'),
]

@pytest.mark.parametrize('size, groups, error, says', BAD, ids=[f'{i}:{b[3][:40]}' for i, b in enumerate(BAD)])
def test_a_declaration_it_cannot_serve_is_refused_by_name(size, groups, error, says):
    with pytest.raises(error, match=re.escape(says)): HeaderLayout(size, **groups)


def test_the_names_it_accepts_are_read_back_as_themselves():
    "Soft keywords, builtins' names, non-ASCII identifiers and the writer's own name serve every reading: offsets, writer, HEADER."
    names = ('ß', 'match', 'case', 'len', 'write', 'HEADER', 'self')
    lay = HeaderLayout(np.int64(10), step=list(names[:-1]), ring=(names[-1],))
    assert type(lay.size) is int and lay.size == 10 and lay.groups == {'step': names[:-1], 'ring': names[-1:]}
    assert [getattr(lay.offsets, n) for n in names] == list(range(len(names)))
    m = np.zeros(10, np.int32)
    lay.writer(names)(memoryview(m), *range(1, 8))
    assert m.tolist() == [1, 2, 3, 4, 5, 6, 7, 0, 0, 0]
    def w(m, v): HEADER(m, self=v + 6, ß=v, match=v + 1, case=v + 2, len=v + 3, write=v + 4, HEADER=v + 5)
    m = np.zeros(10, np.int32)
    lay.inline(w)(memoryview(m), 11)
    assert m.tolist() == [11, 12, 13, 14, 15, 16, 17, 0, 0, 0]


def test_a_group_given_as_a_list_is_kept_as_a_tuple():
    "`inline` joins the step's and the ring's fields: a list and a tuple given would not join."
    lay = HeaderLayout(4, step=['a', 'b'], ring=('c',))
    assert lay.groups == {'step': ('a', 'b'), 'ring': ('c',)} and lay.names == ('a', 'b', 'c')
    def w(m): HEADER(m, c=3, a=1, b=2)                                      # noqa: F821 (compiled away)
    m = [0] * 4
    lay.inline(w)(m)
    assert m == [1, 2, 3, 0]


def test_the_package_declares_nothing_the_rules_refuse():
    from tokenspeed_lit.staging.step_plan import STEP_HEADER, HDR
    assert HeaderLayout(STEP_HEADER.size, **STEP_HEADER.groups).names == STEP_HEADER.names
    assert [getattr(HDR, n) for n in STEP_HEADER.names] == list(range(len(STEP_HEADER.names)))


def test_writers_and_inline_name_what_the_layout_lacks():
    h = HeaderLayout(8, bound=('a', 'b'))
    for fields, err, msg in ((('a', 'zz'), ValueError, "not header fields: ['zz']"), ('ab', TypeError, 'fields must be a tuple or list'),
                             (('a', 'a'), ValueError, 'a field is named twice')):
        with pytest.raises(err, match=re.escape(msg)): h.writer(fields)
    with pytest.raises(ValueError, match='the layout has no step or ring group'): h.inline(lambda m: None)
