"""Keeping stalls off the UI thread while a reply streams: the code lexers warmed while the model loads, and the
full garbage collection paced between replies. A mixin of ChatApp (like actions.py) plus one function."""
from __future__ import annotations

import gc
import time

GC_DELAY_S = 0.5  # after a turn ends: let the last repaint happen first
GC_QUIET_S = 1.0  # ... and wait for a pause in the typing: the full pass stalls the UI thread (~200 ms measured)
_GC_DEFAULT = gc.get_threshold()
_GC_NO_FULL = 1_000_000  # gen-1 collections before a gen-2 one: "not during this reply"


def warm_code_highlighting() -> None:
    """Import the syntax lexers replies use most, while the loading screen is up: the first Python code block
    otherwise pays pygments' lexer import (~80 ms) on the UI thread, mid-reply, in front of a key press."""
    try:
        from pygments.lexers import get_lexer_by_name
    except ImportError:
        return
    for name in ("python", "bash", "json", "javascript", "typescript", "c", "cpp", "rust", "go", "java",
                 "markdown", "yaml", "toml", "sql", "html", "css", "diff", "text"):
        try:
            get_lexer_by_name(name)
        except Exception:  # a lexer this pygments lacks: nothing to warm
            continue
    try:  # and Textual's own highlighting path (its theme and token tables), as a code block will use it
        from textual.highlight import highlight

        highlight("for i in range(3):\n    print(i)\n", language="python")
    except Exception:  # an older Textual without textual.highlight: the lexers above are the main cost
        pass


class GcPacing:
    """Needs the ChatApp attributes: generating, _typed_at, _gc_timer, set_timer."""

    def hold_full_gc(self) -> None:
        """A reply starts streaming: no gen-2 pass until _gc_checkpoint's own."""
        gc.set_threshold(_GC_DEFAULT[0], _GC_DEFAULT[1], _GC_NO_FULL)

    def schedule_gc_checkpoint(self) -> None:
        # gen-2 stays held until the checkpoint's own full pass. Restoring the default thresholds here made the
        # very next gen-1 collection a full one (36-95 ms measured, right as the reply ended).
        if self._gc_timer is None:
            self._gc_timer = self.set_timer(GC_DELAY_S, self._gc_checkpoint)

    def note_typing(self) -> None:
        self._typed_at = time.perf_counter()

    def restore_gc(self) -> None:
        gc.set_threshold(*_GC_DEFAULT)  # the process (a test run, say) outlives the app: leave GC as it was
        gc.unfreeze()

    def _gc_checkpoint(self) -> None:
        """The full garbage collection, run here while idle instead of in the middle of a reply.

        A full (gen-2) pass scans every tracked object: with a loaded model and a long conversation it took
        30-60 ms and landed mid-stream, stalling key presses. So while a reply streams, gen-2 is held off
        (start_turn; young garbage is still collected by gen 0/1), and after each turn one full pass runs here.
        What survives is then frozen, so the occasional gen-2 pass between turns scans only newer objects;
        unfreezing first lets this pass free what was frozen and has since been dropped (old widgets).
        That pass took 120-200 ms in tests (torch loaded), and people often type the next prompt just as a reply
        ends: while they type it waits (gen-2 stays held), and runs at the first pause of GC_QUIET_S.
        """
        self._gc_timer = None
        if self.generating:
            return  # this turn's end schedules the next checkpoint
        if time.perf_counter() - self._typed_at < GC_QUIET_S:
            self._gc_timer = self.set_timer(GC_DELAY_S, self._gc_checkpoint)
            return
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        gc.set_threshold(*_GC_DEFAULT)
