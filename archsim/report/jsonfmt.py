"""JSON text for the documents archsim writes: indented for a person, except that a list of
plain numbers (or strings) stays on one line, so a timeline matrix is one line per window
instead of one line per value."""

from __future__ import annotations

import json
import re

# a bracketed list holding only numbers, null, true/false or short strings without brackets
_FLAT = re.compile(r'\[\s*((?:(?:-?[\d.eE+-]+|null|true|false|"[^"\[\]{}\n]*")\s*,\s*)*'
                   r'(?:-?[\d.eE+-]+|null|true|false|"[^"\[\]{}\n]*"))\s*\]')


def dumps(obj) -> str:
    text = json.dumps(obj, indent=2)
    # json.dumps puts ",\n" + indent between items; a JSON string never holds a raw newline
    return _FLAT.sub(lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)
