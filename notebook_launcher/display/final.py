"""How the panel's state tells a run's end and its hang notices: each stack and traceback once.

A hang or timeout error's message holds every rank's Python stacks, and a failure's message holds the root
cause's traceback: the state carries those once, in ``failure["stacks"]`` and ``failure["traceback"]``, and the
failure's ``message`` keeps the rest (the other ranks, where each one was, the run log). Its first paragraph is
the ``verdict``, the card's title.

A hang notice's ``text`` leaves out the stacks its ``stacks`` carry; its card (``hang_card``) has what the
panel needs to move it on by its own clock between updates: since when each rank waits and no rank progressed,
and when ``timeout=`` will stop the run (on the panel's clock: seconds since the run started).
"""

from __future__ import annotations

import re

MAX_TEXT = 2000  # (rank_state.MAX_TEXT)
MAX_STACK = 4000  # one rank's stack in a hang notice (the run log keeps all of it)
MAX_STACKS = 16  # ranks whose stack the notice carries (the diverged rank first, then the lowest)
MAX_HANG_RANKS = 256  # ranks a notice lists, each in one line of at most MAX_HANG_LINE characters
MAX_HANG_LINE = 400
MAX_VERDICT = 1000  # a failure card's title
_STACKS_HEADER = re.compile(r"^(?P<indent> *)Python stacks of rank -?\d+:$")


def without_stacks(text: str) -> str:
    """``text`` without its "Python stacks of rank N:" blocks (the header and the lines indented below it)."""
    out, indent = [], None
    for line in text.split("\n"):
        if indent is not None and line.startswith(" " * (indent + 1)):
            continue
        indent = None
        header = _STACKS_HEADER.match(line)
        if header:
            indent = len(header["indent"])
            continue
        out.append(line)
    return "\n".join(out)


def failure_card(failure: dict) -> dict:
    """The failure as the state keeps it: ``verdict`` (the message's first paragraph), ``message`` without
    the verdict, the traceback and the stacks (they are in their own fields)."""
    message = str(failure.get("message") or "")
    verdict, _, rest = message.partition("\n\n")
    if len(verdict) > MAX_VERDICT:  # not a verdict but a long message: all of it stays in the message
        verdict, rest = verdict[:MAX_VERDICT] + "...", message
    traceback = str(failure.get("traceback") or "").rstrip()
    if traceback:
        rest = rest.replace(traceback, "")
    if failure.get("stacks"):
        rest = without_stacks(rest)
    rest = re.sub(r"\n{3,}", "\n\n", rest).strip("\n")
    return {**failure, "verdict": verdict.strip(), "message": rest}


def hang_card(data: dict, started: float, now: float) -> dict:
    """The live card of an open ``hang_notice``'s data, noticed at ``now`` (a hang open since ``started``)."""
    ranks = {}
    for key, place in list((data.get("ranks") or {}).items())[:MAX_HANG_RANKS]:
        place = place if isinstance(place, dict) else {}
        ranks[str(key)] = {"state": str(place.get("state", ""))[:16],
                           "text": str(place.get("text", ""))[:MAX_HANG_LINE]}
        waited = number(place.get("waited"))
        if waited is not None:  # (the panel's clock moves it on: "waiting 7 s", "waiting 8 s", ...)
            ranks[str(key)]["since_t"] = round(now - waited, 3)
    diverged = data.get("diverged")
    diverged = diverged if isinstance(diverged, int) and not isinstance(diverged, bool) else None
    quiet, timeout_in = number(data.get("quiet_s")), number(data.get("timeout_in"))
    return {"live": True, "t": started, "quiet_s": quiet, "ranks": ranks, "diverged": diverged,
            "stacks": _bounded_stacks(data.get("stacks") or {}, diverged),
            "text": without_stacks(str(data.get("text", "")))[:MAX_TEXT * 4],
            "verdict": str(data.get("verdict") or "")[:MAX_HANG_LINE * 4] or None,
            "notice_t": now, "quiet_since_t": round(now - quiet, 3) if quiet is not None else None,
            "timeout": number(data.get("timeout")),
            "timeout_t": round(now + timeout_in, 3) if timeout_in is not None else None,
            "cleared_after": None, "cleared_t": None, "cleared_text": None}


def number(value) -> float | None:
    return round(float(value), 3) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bounded_stacks(stacks: dict, diverged: int | None) -> dict:
    """At most MAX_STACKS ranks' stacks (the diverged rank's first), each cut to MAX_STACK characters."""
    texts = {str(key): str(text) for key, text in stacks.items()}
    order = sorted(texts, key=lambda key: (key != str(diverged), len(key), key))[:MAX_STACKS]
    out = {}
    for key in sorted(order, key=lambda key: (len(key), key)):
        text = texts[key]
        if len(text) > MAX_STACK:
            text = f"{text[:MAX_STACK]}\n... ({len(text) - MAX_STACK} more characters in the run log)"
        out[key] = text
    return out
