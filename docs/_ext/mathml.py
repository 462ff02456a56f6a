"""Sphinx math rendered to MathML at build time (latex2mathml), so that no page loads MathJax from a CDN.

Chromium, Firefox and Safari render MathML Core natively."""
from html import escape
from docutils import nodes
from latex2mathml.converter import convert

def _mathml(latex, display):
    try: return convert(latex, display=display)
    except Exception: return f'<code class="math-source">{escape(latex)}</code>'   # shown as its LaTeX

def visit_math(self, node):
    self.body.append(self.starttag(node, 'span', '', CLASS='math') + _mathml(node.astext(), 'inline') + '</span>')
    raise nodes.SkipNode

def visit_math_block(self, node):
    if node.get('label'): self.body.append(f'<span class="eqno">({node["number"]})</span>')
    self.body.append(self.starttag(node, 'div', CLASS='math') + _mathml(node.astext(), 'block') + '</div>\n')
    raise nodes.SkipNode

def setup(app):
    app.add_html_math_renderer('mathml', (visit_math, None), (visit_math_block, None))
    return {'parallel_read_safe': True, 'parallel_write_safe': True}
