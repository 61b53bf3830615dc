"""`qwenlocal chat`: the Textual app. Loading, the turn loop and the typed messages from the worker threads.

Threads: the backend's `load` and each turn's event loop run in thread workers (harlequin style). They only
post typed messages (messages.py); every widget is touched here, on the UI thread. The user-facing commands
(new chat, regenerate, edit, ...) live in actions.py; what keeps stalls off the UI thread mid-reply (lexers
warmed while loading, garbage collection paced between replies) in stalls.py.
"""
from __future__ import annotations

import threading
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.timer import Timer
from textual.widgets import Footer, Header, Static, TextArea

from qwenlocal.engine.errors import QwenlocalError
from qwenlocal.engine.events import EngineError, ReasoningDelta, Stats, TokenDelta, TurnDone

from . import messages as msg
from .actions import ChatActions
from .backend import ChatBackend, explain_load_error
from .commands import ChatCommandsProvider
from .context import ContextTooLong
from .copying import CopyActions
from .conversation import Conversation
from .modals import ErrorModal
from .overflow import ContextFullActions, SendPlan
from .panels import LoadingScreen
from .prompt import SEND_DEFAULT, SEND_ID, PromptInput
from .settings import load_chat_settings
from .stalls import GcPacing, warm_code_highlighting
from .status import StatusBar, plan_summary
from .store import ConversationStore
from .widgets import AssistantMessage, UserMessage

def _css_path() -> Path:
    # Editable installs map qwenlocal.assets to the repo's assets/; a wheel puts it next to qwenlocal.app.
    import qwenlocal.assets

    return Path(qwenlocal.assets.__file__).parent / "chat.tcss"


class ChatApp(ChatActions, ContextFullActions, CopyActions, GcPacing, App[int]):
    CSS_PATH = _css_path()
    TITLE = "qwenlocal chat"
    COMMANDS = App.COMMANDS | {ChatCommandsProvider}
    BINDING_GROUP_TITLE = "Chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop", id="chat.stop", tooltip="Stop generating (within one decode step)"),
        Binding("ctrl+n", "new_chat", "New", id="chat.new", tooltip="Start a new conversation"),
        Binding("ctrl+r", "regenerate", "Regen", id="chat.regenerate", tooltip="Run the last turn again"),
        Binding("ctrl+g", "edit_last", "Edit", id="chat.edit", tooltip="Edit your last message and re-run it"),
        Binding("ctrl+t", "toggle_thinking", "Think", id="chat.thinking", tooltip="Thinking on/off"),
        Binding("f1", "help", "Help", id="chat.help", tooltip="Keys and commands"),
        Binding("f2", "details", "Details", id="chat.details", tooltip="The plan with its reasons, and counters"),
        Binding("ctrl+o", "open_conversation", "Open", id="chat.open", show=False,
                tooltip="Saved conversations: open, search, rename, delete"),
        Binding("ctrl+s", "save_transcript", "Save", id="chat.save", show=False,
                tooltip="Save the transcript as Markdown and JSON"),
        Binding("ctrl+b", "copy_reply", "Copy reply", id="chat.copy", show=False,
                tooltip="Copy the last reply to the clipboard"),
        Binding("f8", "code_older", "Code block", id="chat.code_next", show=False,
                tooltip="Highlight the next code block (newest first, cycles)"),
        Binding("shift+f8", "code_newer", "Code block back", id="chat.code_prev", show=False,
                tooltip="Highlight the previous (newer) code block"),
        Binding("ctrl+l", "copy_code", "Copy code", id="chat.copy_code", show=False,
                tooltip="Copy the highlighted code block (none highlighted: the newest)"),
        Binding("f3", "toggle_theme", "Theme", id="chat.theme", show=False, tooltip="Light/dark theme"),
        Binding("f4", "system_prompt", "System prompt", id="chat.system", show=False,
                tooltip="Set the system prompt"),
        Binding("f5", "sampling", "Sampling", id="chat.sampling", show=False, tooltip="Sampling settings"),
    ]

    def __init__(self, backend: ChatBackend, *, store: ConversationStore | None = None, thinking: bool = True,
                 sampling: dict | None = None, system: str = "", keymap: dict[str, str] | None = None,
                 theme: str | None = None, export_dir: Path | None = None, settings_path: Path | None = None):
        super().__init__()
        self.backend = backend
        self.store = store or ConversationStore.default()
        self.export_dir = export_dir
        self.thinking = thinking
        self.sampling = {k: v for k, v in (sampling or {}).items() if v is not None}
        self.system = system
        self.keymap = keymap or {}
        if settings_path is None:
            from qwenlocal.app.paths import data_dir

            settings_path = data_dir() / "chat-settings.json"
        self.settings_path = settings_path
        self.chat_settings, self._settings_warning = load_chat_settings(settings_path)
        self._context_full_choice: str | None = None  # drop/summarise, chosen in this conversation's modal
        self._summarising = False  # a summary of the oldest turns is being written (Esc drops them instead)
        self._summary_cancel = threading.Event()
        self.start_theme = theme
        self.conv = Conversation(system=system)
        self.ready = False
        self.generating = False
        self.load_error: str | None = None
        self._turn_id = 0
        self._quitting = False
        self._banner_text = ""
        self._left_out = 0  # the oldest turns the last trimmed turn left out (its note is shown once per count)
        self._cancel = threading.Event()
        self._turn_done = threading.Event()
        self._turn_done.set()  # no turn is running yet
        self._reply: AssistantMessage | None = None
        self._loading: LoadingScreen | None = None
        self._load_state: tuple[tuple[str, ...], int, int] = ((), 0, 1)
        self._load_posted = False
        self._typed_at = 0.0  # when a text field last changed (see stalls.py)
        self._gc_timer: Timer | None = None

    # ----- layout and start-up -----
    def compose(self) -> ComposeResult:
        # Kept as attributes: App.query_one searches the *active* screen, which is a modal at times.
        self.view = VerticalScroll(id="conversation")
        # The scrollbar's column is reserved from the start: otherwise the first time a streaming reply overflows
        # the view, the scrollbar appears, every message narrows by a column and the whole conversation is
        # re-wrapped and re-measured in one layout, mid-stream (measured: the slowest refreshes of a reply, and
        # the keys typed then). (Set here rather than in chat.tcss so it stays with the reason.)
        self.view.styles.scrollbar_gutter = "stable"
        self.banner = Static("", id="banner", markup=False)
        self.prompt = PromptInput(id="prompt", send_keys=self.keymap.get(SEND_ID, SEND_DEFAULT))
        self.status = StatusBar(id="status")
        yield Header(show_clock=False)
        with self.view:
            yield self.banner
        yield self.prompt
        yield self.status
        yield Footer()

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        if self.start_theme:
            self.theme = self.start_theme
        self.view.anchor()
        self.status.show(state="loading", thinking=self.thinking)
        self._loading = LoadingScreen(self.backend.label)
        self.push_screen(self._loading)
        if self._settings_warning:
            self.notify(self._settings_warning, severity="warning", timeout=10)
        self._load()

    @work(thread=True, exit_on_error=False, group="load", description="Loading the model")
    def _load(self) -> None:
        # The weight loader reports once per tensor. Coalesce: keep only the latest state, and have at most one
        # LoadProgress message in flight; its handler reads the latest state, so the screen is never stale.
        stages: list[str] = []

        def progress(stage: str, done: int, total: int) -> None:
            if not stages or stages[-1] != stage:
                stages.append(stage)
            self._load_state = (tuple(stages), done, total)
            if not self._load_posted:
                self._load_posted = True
                self.post_message(msg.LoadProgress(stage, done, total))

        try:
            self.backend.load(progress)
        except Exception as exc:  # every failure becomes a modal that says what to do
            self.post_message(msg.LoadFailed(*explain_load_error(exc)))
            return
        warm_code_highlighting()
        self.post_message(msg.BackendReady(self.backend.label, self.backend.plan))

    def on_load_progress(self, m: msg.LoadProgress) -> None:
        self._load_posted = False  # before reading: a later update posts again
        stages, done, total = self._load_state
        if self._loading is not None and self._loading.is_attached:
            self._loading.progress(list(stages), done, total)

    def on_backend_ready(self, m: msg.BackendReady) -> None:
        self.ready = True
        self.sub_title = m.label
        self.conv.model = m.label
        if self._loading is not None and self.screen is self._loading:
            self.pop_screen()
        self._loading = None
        self.status.set_plan(m.plan)
        self.status.show(self.backend.stats(), state="ready")
        self._gc_checkpoint()
        self._banner_text = (f"Model: {m.label}\n{plan_summary(m.plan)}"
                             "Enter sends · Ctrl+J newline · Esc stops · F1 help · Ctrl+P commands")
        self.show_banner()
        self.prompt.focus()

    def on_load_failed(self, m: msg.LoadFailed) -> None:
        self.load_error = f"{m.title}: {m.message}\n{m.hint}"
        self.push_screen(ErrorModal(m.title, m.message, m.hint, button="Quit"),
                         callback=lambda _: self.exit(return_code=1))

    def on_unmount(self) -> None:
        self.save_partial_reply()  # the app closing with a reply in flight, however it closes
        self._cancel.set()
        self.backend.close()
        self.restore_gc()

    # ----- sending and the turn loop -----
    async def on_prompt_input_submitted(self, m: PromptInput.Submitted) -> None:
        await self.submit(m.text)

    async def submit(self, text: str) -> None:
        """A line from the prompt: a slash command, or a user message."""
        if await self.run_slash(text):
            self.prompt.remember(text)
            self.prompt.clear()
            return
        if not self.ready:
            self.notify("The model is still loading.", severity="warning")
            return
        if self.generating:
            self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return
        text = text[1:] if text.lstrip().startswith("//") else text
        self.prompt.remember(text)
        self.prompt.clear()
        await self.add_user_message(text)
        await self.start_turn(reuse_prefix=len(self.conv.engine_messages()) - 1)

    async def add_user_message(self, text: str) -> None:
        self.conv.add("user", text)
        await self.view.mount(UserMessage(text))
        self.save_conversation()

    async def start_turn(self, reuse_prefix: int = 0) -> None:
        """Run the backend on the conversation as it stands and stream the reply into a new widget."""
        self._turn_id += 1
        self.generating = True
        self.hold_full_gc()
        self._cancel = cancel = threading.Event()
        prev_done, self._turn_done = self._turn_done, threading.Event()
        self._reply = AssistantMessage(streaming=True)
        await self.view.mount(self._reply)
        self.view.anchor()
        self.status.reset_turn()
        self.status.show(state="generating")
        self._summary_cancel = threading.Event()  # Esc while this turn summarises (stop_generation)
        plan = self.send_plan(self._summary_cancel)
        self._generate(self._turn_id, plan, dict(self.sampling), self.thinking, cancel, prev_done, self._turn_done,
                       reuse_prefix)

    @work(thread=True, exit_on_error=False, group="generate", description="Generating a reply")
    def _generate(self, turn_id: int, plan: SendPlan, sampling: dict, thinking: bool,
                  cancel: threading.Event, prev_done: threading.Event, done: threading.Event,
                  reuse_prefix: int) -> None:
        post = self.post_message
        try:
            # A stopped turn may still be inside its last decode step; the engine runs one request at a time
            # (a summary of the oldest turns, in _fit, is one too).
            prev_done.wait()
            try:
                fitted = self._fit(turn_id, plan, thinking, reuse_prefix)
            except ContextTooLong as exc:
                post(msg.ReplyFailed(turn_id, str(exc), "ContextLimitError"))
                return
            if fitted is None:  # the user chooses drop or summarise first (overflow.py)
                return
            messages, reuse_prefix = fitted
            for ev in self.backend.start_turn(messages, sampling, thinking, cancel, reuse_prefix):
                if isinstance(ev, TokenDelta):
                    post(msg.ReplyDelta(turn_id, ev.text, False))
                elif isinstance(ev, ReasoningDelta):
                    post(msg.ReplyDelta(turn_id, ev.text, True))
                elif isinstance(ev, Stats):
                    post(msg.ReplyStats(turn_id, dict(ev.values)))
                elif isinstance(ev, TurnDone):
                    post(msg.ReplyDone(turn_id, ev.finish_reason, ev.text, ev.reasoning, dict(ev.stats)))
                    return
                elif isinstance(ev, EngineError):
                    post(msg.ReplyFailed(turn_id, ev.message, ev.kind))
                    return
            post(msg.ReplyFailed(turn_id, "the backend ended the reply without finishing it", "StreamError"))
        except QwenlocalError as exc:
            post(msg.ReplyFailed(turn_id, str(exc), type(exc).__name__))
        except Exception as exc:  # a bug in a backend must not kill the app
            post(msg.ReplyFailed(turn_id, f"{type(exc).__name__}: {exc}", type(exc).__name__))
        finally:
            done.set()

    def _current(self, turn_id: int) -> AssistantMessage | None:
        # Messages of a turn that was stopped and replaced (regenerate, new chat) are dropped here.
        return self._reply if turn_id == self._turn_id else None

    def on_reply_delta(self, m: msg.ReplyDelta) -> None:
        reply = self._current(m.turn_id)
        if reply is not None:
            reply.append(m.text, m.reasoning)

    def on_reply_stats(self, m: msg.ReplyStats) -> None:
        if self._current(m.turn_id) is not None:
            self.status.show(m.values)

    async def on_reply_done(self, m: msg.ReplyDone) -> None:
        reply = self._current(m.turn_id)
        if reply is None:
            return
        await reply.finish(m.finish_reason)
        self.conv.add("assistant", m.text, reasoning=m.reasoning, finish_reason=m.finish_reason, stats=m.stats)
        self._end_turn("stopped" if m.finish_reason == "cancelled" else "ready", m.stats)
        if self._quitting:
            self.exit()

    async def on_reply_failed(self, m: msg.ReplyFailed) -> None:
        reply = self._current(m.turn_id)
        if reply is None:
            return
        await reply.finish("error", error=m.message)
        # Kept (so the view and the history stay aligned) but never sent back to the model; a message refused as
        # too long for the context ("refused") is not sent again either (conversation.py).
        reason = "refused" if m.kind == "ContextLimitError" else "error"
        self.conv.add("assistant", reply.text, reasoning=reply.reasoning, finish_reason=reason)
        self.notify(m.message, title="Generation failed", severity="error", timeout=8)
        self._end_turn("error", self._context_now())
        if self._quitting:
            self.exit()

    def _context_now(self) -> dict:
        """The status figures for what the next turn will send (after a refused message: without it)."""
        count = getattr(self.backend, "count_tokens", None)
        msgs = self.messages_to_send()
        size = count(msgs, self.thinking) if count is not None and msgs else 0
        return {"prompt_tokens": size or 0, "completion_tokens": 0}

    def _end_turn(self, state: str, stats: dict) -> None:
        self.drop_reply()
        self.status.show(stats, state=state)
        self.save_conversation()

    def drop_reply(self) -> None:
        """The current reply is over (finished, failed, or abandoned by a rewind)."""
        self.generating, self._reply = False, None
        self.schedule_gc_checkpoint()

    def on_text_area_changed(self, m: TextArea.Changed) -> None:
        self.note_typing()
        if self._reply is not None and m.text_area is self.prompt:
            self._reply.typed()  # while typing, the streaming reply redraws right after each key (widgets.py)

    def stop_generation(self) -> bool:
        if not self.generating:
            return False
        if self._summarising:  # Esc stops the summary only: the oldest turns are dropped instead
            self._summary_cancel.set()
            self.status.show(state="dropping the oldest turns instead")
            return True
        self._cancel.set()
        self.status.show(state="stopping")
        return True

    def save_conversation(self) -> None:
        if not self.conv.messages:
            return
        try:
            self.store.save(self.conv)
        except OSError as exc:
            self.notify(f"could not save the conversation: {exc}", severity="error")
