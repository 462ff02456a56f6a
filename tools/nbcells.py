"""Cell options shared by the tools: `#| key: value` lines at the top of a code cell (nbdev / Quarto style)."""
import re

_re_directive = re.compile(r'^\s*#\s*\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')

def split_directives(src):
    "Cell options (`#| key: value` lines at the top, blank lines allowed) as a dict, and the rest of the source."
    lines, d = src.splitlines(), {}
    i = 0
    while i < len(lines) and (not lines[i].strip() or _re_directive.match(lines[i])):
        m = _re_directive.match(lines[i])
        if m: d[m.group(1)] = m.group(2).strip('"\'')
        i += 1
    return d, '\n'.join(lines[i:])

def is_false(v): return str(v).lower() in ('false', 'no', '0')
