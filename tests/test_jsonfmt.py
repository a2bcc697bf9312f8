"""The JSON writer: json.dumps(indent=2) with every list of scalars on one line, written in one
pass; checked against that rule applied to json.dumps's own text (the regex oracle below)."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from archsim.report import jsonfmt

_FLAT = re.compile(r'\[\s*((?:(?:-?[\d.eE+-]+|null|true|false|"[^"\[\]{}\n]*")\s*,\s*)*'
                   r'(?:-?[\d.eE+-]+|null|true|false|"[^"\[\]{}\n]*"))\s*\]')


def _oracle(obj) -> str:
    text = json.dumps(obj, indent=2)
    return _FLAT.sub(lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 12, 10 ** 12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                      max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(values)
def test_writer_matches_the_rule(obj):
    assert jsonfmt.dumps(obj) == _oracle(obj)


def test_flat_lists_on_one_line_and_keys_as_json_writes_them():
    doc = {"timeline": [[1, 2.5, None], [True, "a b"]], "s": ['say "x"', "y"], 1: {}, None: [], 2.5: (1, 2)}
    text = jsonfmt.dumps(doc)
    assert text == _oracle(doc)
    assert '[1, 2.5, null]' in text and '"null": []' in text and '"2.5": [1, 2]' in text
    assert json.loads(text) == json.loads(json.dumps(doc))
