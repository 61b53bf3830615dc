"""Keymap validation: every entry names a binding that exists and keys Textual can match.

Textual accepts any string as a key and any id in `set_keymap`, so `ctrl+zz` or a misspelt id would be kept
silently and the key would never fire; here they are refused with what would be accepted.
"""
from __future__ import annotations

import difflib
from typing import Iterable, Mapping

from textual.keys import KEY_NAME_REPLACEMENTS, Keys, key_to_character

from qwenlocal.engine.errors import OptionError

MODIFIERS = ("ctrl", "shift", "alt", "meta", "super", "hyper")
_NAMED = ({k.value for k in Keys if "+" not in k.value and not k.value.startswith("<")}
          | set(KEY_NAME_REPLACEMENTS.values()))


def binding_ids() -> list[str]:
    """The ids a keymap may remap: the app's, the prompt's (send included) and the dialogs'."""
    from qwenlocal.app.chat import modals, panels, picker
    from qwenlocal.app.chat.app import ChatApp
    from qwenlocal.app.chat.prompt import SEND_ID, PromptInput

    dialogs = [obj for mod in (modals, panels, picker) for obj in vars(mod).values() if isinstance(obj, type)]
    ids = {SEND_ID}
    for owner in (ChatApp, PromptInput, *dialogs):
        ids.update(b.id for b in getattr(owner, "BINDINGS", None) or () if getattr(b, "id", None))
    return sorted(ids)


def key_problem(key: str) -> str | None:
    """Why one key ('ctrl+n', 'f9', 'a') cannot match, or None."""
    *mods, name = key.strip().split("+")
    bad = [m for m in mods if m not in MODIFIERS]
    if bad:
        return f"{'+'.join(bad)!r} is not a modifier ({', '.join(MODIFIERS)})"
    if len(set(mods)) != len(mods):
        return "a modifier is repeated"
    if not name:
        return "no key after the modifiers"
    if name in _NAMED or (len(name) == 1 and name.isprintable()) or key_to_character(name) is not None:
        return None
    close = difflib.get_close_matches(name, sorted(_NAMED), n=1)
    return f"{name!r} is not a key name" + (f" (did you mean {close[0]!r}?)" if close else "")


def validate_keymap(raw: Mapping[str, str], source: str, ids: Iterable[str] | None = None) -> dict[str, str]:
    known = list(ids) if ids is not None else binding_ids()
    for bid, keys in raw.items():
        if bid not in known:
            close = difflib.get_close_matches(bid, known, n=1)
            raise OptionError(f"{source}: {bid!r} is not a binding id" + (f" (did you mean {close[0]!r}?)" if close else "")
                              + f"; the ids are {', '.join(known)} (F1 lists them)")
        parts = [k.strip() for k in keys.split(",")]
        if not any(parts):
            raise OptionError(f"{source}: {bid}: no key given")
        for key in parts:
            problem = key_problem(key) if key else "an empty key between commas"
            if problem:
                raise OptionError(f"{source}: {bid}: {key!r}: {problem}; write keys like ctrl+n, f9 or ctrl+shift+k")
    return dict(raw)
