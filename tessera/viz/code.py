"""Source and IR text as highlighted HTML: pygments with inline styles when it is installed (so
the HTML renders on GitHub and nbviewer without a stylesheet), else an escaped <pre>."""
from __future__ import annotations

import functools
from html import escape

from ..errors import ArgumentError

LANGUAGES = ("c", "cuda", "hip", "ir", "python")
PRE_STYLE = "line-height: 125%;"
NO_WRAP = "white-space:pre;"      # a notebook's CSS would wrap long lines mid-number


@functools.lru_cache(maxsize=None)
def ir_lexer_class():
    """A pygments lexer for the text forms of Graph, Schedule and Tile IR (made on first use, so
    importing tessera never imports pygments)."""
    from pygments.lexer import RegexLexer, bygroups, words
    from pygments.token import (Comment, Keyword, Name, Number, Operator, Punctuation, String,
                                Text, Whitespace)

    class TesseraIRLexer(RegexLexer):
        name = "Tessera IR"
        aliases = ["tessera-ir"]
        tokens = {"root": [
            (r"\s+", Whitespace),
            (r"#.*$", Comment.Single),
            (r"/\*.*?\*/", Comment.Multiline),
            (r'"[^"]*"', String),
            (r"@[A-Za-z_][\w.]*", Name.Function),
            (r"%[\w.]+", Name.Variable),
            (r"\b((?:b?f|i|u)\d+|bool)(\[[^\]\n]*\])",
             bygroups(Keyword.Type, Keyword.Type)),
            (r"\b((?:b?f|i|u)\d+|bool)(x\d+)?\b", Keyword.Type),     # f32x4: a vector
            (words(("graph", "schedule", "kernel", "return", "fuses", "knobs", "cost", "target",
                    "strategy", "input", "output", "temp", "const", "inline", "local", "shared",
                    "in", "out", "for", "if", "else", "vload", "vstore", "barrier", "tuned",
                    "true", "false", "None"),
                   prefix=r"\b", suffix=r"\b"), Keyword),
            (r"\.(serial|parallel|vector|unroll|grid|block|thread|warp)\b", Keyword.Pseudo),
            (r"[A-Za-z_]\w*(?=\()", Name.Builtin),
            (r"[A-Za-z_]\w*", Name),
            (r"-?\d+\.\d+(e[+-]?\d+)?|-?\d+e[+-]?\d+", Number.Float),
            (r"-?\d+", Number.Integer),
            (r"->|\.\.|[=+\-*/<>&!|^~?:]", Operator),
            (r"[()\[\]{},;.]", Punctuation),
            (r".", Text),
        ]}

    return TesseraIRLexer


def _lexer(language: str):
    from pygments.lexers import CLexer, CudaLexer, PythonLexer
    if language == "ir":
        return ir_lexer_class()()
    # HIP is CUDA's dialect of C++: the CUDA lexer knows its qualifiers and builtins
    return {"c": CLexer, "cuda": CudaLexer, "hip": CudaLexer, "python": PythonLexer}[language]()


def highlight_html(text: str, language: str) -> str:
    """HTML of text with syntax highlighting for language ("c", "cuda", "hip", "ir" for Tessera's
    IR text forms, "python"): pygments with inline styles, or, without pygments, the escaped text
    in a <pre>. Deterministic."""
    if language not in LANGUAGES:
        raise ArgumentError(f"cannot highlight language {language!r}",
                            expected=", ".join(LANGUAGES))
    text = str(text)
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
    except ImportError:
        return (f'<div class="highlight"><pre style="{NO_WRAP}{PRE_STYLE}">{escape(text)}</pre>'
                f'</div>\n')
    out = highlight(text, _lexer(language), HtmlFormatter(noclasses=True, style="default"))
    return out.replace('<pre style="', f'<pre style="{NO_WRAP}', 1)
