"""Each kind of event is declared once (``schema/kinds.py``); every table made by hand elsewhere must name every
kind, so a new kind left out of one fails here, naming the table."""

from notebook_launcher.display import describe, fallback, state
from notebook_launcher.display.budget import CARD_LISTS
from notebook_launcher.display.state import RunState
from notebook_launcher.schema import events, kinds
from notebook_launcher.schema.kinds import FALLBACK_PLACES, KINDS


def test_every_kind_is_in_every_table():
    names = [kind.name for kind in KINDS]
    assert len(set(names)) == len(names), "a kind is declared twice in schema/kinds.py KINDS"
    tables = {
        "display/describe.py _KINDS (how it reads as text; None: as its data)": (describe._KINDS, set(names)),
        "display/state.py _HANDLERS (the kinds with panel=True)": (
            state._HANDLERS, {kind.name for kind in KINDS if kind.panel}),
        "display/fallback.py CARD_LINES (the kinds with fallback='cards')": (
            fallback.CARD_LINES, {kind.name for kind in KINDS if kind.fallback == "cards"}),
        "schema/events.py DATA_SCHEMA and KERNEL_ONLY_KINDS": (
            {*events.DATA_SCHEMA, *events.KERNEL_ONLY_KINDS}, set(names)),
    }
    for table, (keys, expected) in tables.items():
        assert not expected - set(keys), f"{table} has no entry for {sorted(expected - set(keys))}"
        assert not set(keys) - expected, f"{table} has entries for {sorted(set(keys) - expected)}, not declared so"
    constants = {value for name, value in vars(kinds).items() if name.isupper() and value in names}
    assert constants == set(names), f"schema/kinds.py has no constant for {sorted(set(names) - constants)}"


def test_each_declaration_says_how_the_panel_and_fallback_show_it():
    keys = RunState("run", "/tmp/run", "cpu", "gloo", "fork", 2, 2, [0, 1]).to_json()
    for kind in KINDS:
        assert kind.doc.strip(), f"{kind.name}: no words for its data"
        assert kind.fallback in FALLBACK_PLACES, f"{kind.name}: fallback={kind.fallback!r} is none of {FALLBACK_PLACES}"
        assert kind.panel or not (kind.cards or kind.fallback), f"{kind.name}: the fallback shows the panel's state"
        assert not kind.cards or type(keys.get(kind.cards)) is list, (
            f"{kind.name}: cards={kind.cards!r} is no list of display/state.py's to_json()")
        assert bool(kind.cards) or kind.fallback != "cards", f"{kind.name}: fallback 'cards' without cards"
    assert set(CARD_LISTS) == {kind.cards for kind in KINDS if kind.cards}  # the saved output cuts every list
