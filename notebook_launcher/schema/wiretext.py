"""Text as the wire carries it: every str a rank sends is valid UTF-8.

A lone surrogate (``"\\ud800"``: a bad ``chr``, half an emoji pair, a file name decoded with surrogateescape)
is a str Python holds but no UTF-8 carries: jupyter_client's packer and print() raise on it, which lost a run's
result. The rank's writer (``events.EventWriter``) escapes it at the source, as a print's text always was
(``errors="backslashreplace"``: the six characters ``\\ud800``); the kernel's reader, panel, comm and text
display escape what another writer left, as the last line of defence.
"""

from __future__ import annotations

import re

MAYBE_SURROGATE = 0xED  # the first byte of a surrogate in marshal's UTF-8 (surrogatepass): ED A0..BF xx
# (an int: `0xED in header` is one memchr, 40 ns; `b"\xed" in header` costs ten times that)
SURROGATE_BYTES = re.compile(b"\xed[\xa0-\xbf]")  # (a float's bytes hold 0xED in one frame of twenty: this says)


def wire_text(text: str) -> str:
    """``text`` as UTF-8 can carry it: each lone surrogate (``"\\ud800"``: a bad ``chr``, half an emoji pair, a
    file name decoded with surrogateescape) becomes its backslash escape, the six characters ``\\ud800``, as
    in a rank's prints (``errors="backslashreplace"``); any other text is returned as it is."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def wire_safe(value):
    """``value`` with ``wire_text`` applied to every str in it (dict keys too, through lists, tuples and dicts):
    ``value`` itself when nothing in it needed it, so a caller tells by identity whether anything changed."""
    kind = type(value)
    if kind is str:
        return wire_text(value)
    if kind is dict:
        pairs = [(wire_safe(key), wire_safe(item)) for key, item in value.items()]
        if all(new is old and new_item is old_item
               for (new, new_item), (old, old_item) in zip(pairs, value.items())):
            return value
        return dict(pairs)
    if kind is list or kind is tuple:
        items = [wire_safe(item) for item in value]
        return value if all(new is old for new, old in zip(items, value)) else kind(items)
    return value


def escaped(content, header: bytes):
    """``content`` (what ``header`` is the marshal of) with its lone surrogates escaped, or None when it has
    none. One search of the header's bytes for the byte every surrogate starts with: the usual event costs
    nothing more."""
    if MAYBE_SURROGATE not in header or SURROGATE_BYTES.search(header) is None:
        return None
    try:
        safe = wire_safe(content)
    except RecursionError:  # nested beyond Python's stack: the kernel's reader refuses it anyway
        return None
    return None if safe is content else safe
