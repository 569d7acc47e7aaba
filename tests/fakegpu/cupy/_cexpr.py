"""Evaluate the C statements of ``ElementwiseKernel`` bodies with NumPy, as C would.

The simulated GPU's ``ElementwiseKernel`` must compute what the CUDA code says, not what
ringtune meant: the body (``y = ((x < y || x != x) && !(y != y)) ? x : y``) is parsed here
— ternary, ``||``, ``&&``, ``!``, comparisons, ``+ - * /``, parentheses, ``(float)`` casts,
names and numbers — and evaluated element-wise with C's rules: integer ``/`` truncates
toward zero; CuPy's ``float16``/``bfloat16`` classes compute in float and round when
assigned (the caller passes float32 values and casts the result back).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

_TOKEN = re.compile(r"\s*(\|\||&&|!=|==|<=|>=|[-+*/()<>!?:=;]|[A-Za-z_]\w*"
                    r"|\d+\.?\d*(?:[eE][-+]?\d+)?f?)")


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot parse C at {text[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


def _c_div(a: Any, b: Any) -> Any:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return q + fix.astype(q.dtype)
    return a / b


class _Parser:
    def __init__(self, tokens: list[str], env: dict[str, Any]) -> None:
        self.t = tokens
        self.i = 0
        self.env = env

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ValueError(f"expected {want!r} at token {self.i} of {' '.join(self.t)}")
        self.i += 1
        return tok

    def expr(self) -> Any:
        cond = self.or_()
        if self.peek() == "?":
            self.take("?")
            a = self.expr()
            self.take(":")
            b = self.expr()
            return np.where(cond, a, b)
        return cond

    def or_(self) -> Any:
        v = self.and_()
        while self.peek() == "||":
            self.take()
            v = np.logical_or(v, self.and_())
        return v

    def and_(self) -> Any:
        v = self.cmp()
        while self.peek() == "&&":
            self.take()
            v = np.logical_and(v, self.cmp())
        return v

    def cmp(self) -> Any:
        v = self.add()
        ops = {"<": np.less, ">": np.greater, "<=": np.less_equal, ">=": np.greater_equal,
               "==": np.equal, "!=": np.not_equal}
        if self.peek() in ops:
            op = ops[self.take()]
            v = op(v, self.add())
        return v

    def add(self) -> Any:
        v = self.mul()
        while self.peek() in ("+", "-"):
            v = (np.add if self.take() == "+" else np.subtract)(v, self.mul())
        return v

    def mul(self) -> Any:
        v = self.unary()
        while self.peek() in ("*", "/"):
            v = np.multiply(v, self.unary()) if self.take() == "*" else _c_div(v, self.unary())
        return v

    def unary(self) -> Any:
        tok = self.peek()
        if tok == "!":
            self.take()
            return np.logical_not(self.unary())
        if tok == "-":
            self.take()
            return np.negative(self.unary())
        if tok == "(" and self.t[self.i + 1:self.i + 3] == ["float", ")"]:
            self.i += 3
            return np.asarray(self.unary(), dtype=np.float32)
        return self.primary()

    def primary(self) -> Any:
        tok = self.take()
        if tok == "(":
            v = self.expr()
            self.take(")")
            return v
        if tok in self.env:
            return self.env[tok]
        if re.fullmatch(r"\d+", tok):
            return np.int32(int(tok))
        if re.fullmatch(r"[\d.eE+-]+f?", tok):
            return np.float32(float(tok.rstrip("f"))) if tok.endswith("f") else float(tok)
        raise ValueError(f"unknown name {tok!r} in C expression")


def run(body: str, env: dict[str, Any]) -> dict[str, Any]:
    """Execute ``body`` (``name = expr;`` statements) over ``env``; returns the assigned
    names' values (not yet cast to their variables' types)."""
    out: dict[str, Any] = {}
    for stmt in filter(None, (s.strip() for s in body.split(";"))):
        toks = _tokens(stmt)
        if len(toks) < 3 or toks[1] != "=":
            raise ValueError(f"unsupported C statement {stmt!r}: expected `name = expression`")
        p = _Parser(toks[2:], {**env, **out})
        value = p.expr()
        if p.peek() is not None:
            raise ValueError(f"trailing tokens in {stmt!r}: {' '.join(toks[2 + p.i:])}")
        out[toks[0]] = value
    return out
