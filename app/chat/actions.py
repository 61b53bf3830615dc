"""The chat's commands as App actions (bound to keys, the palette and /slash commands). A mixin of ChatApp.

Regenerate and edit re-run the turn on the edited history. The `reuse_prefix` they pass is the seam for the
engine's conversation snapshots (GPU runtime issue): a backend with snapshots resumes there instead of
prefilling the unchanged history again.
"""
from __future__ import annotations

from pathlib import Path

from .commands import SlashError, parse_slash
from .conversation import Conversation, clean_title
from .modals import ContextFullModal, SamplingModal, TextEditModal
from .panels import DetailsScreen, HelpScreen, details_markdown
from .picker import ConversationPicker
from .prompt import SEND_DEFAULT, SEND_ID, PromptInput
from .settings import CONTEXT_FULL_CHOICES, describe, parse_assignments
from .store import export_transcript
from .widgets import AssistantMessage, UserMessage

QUIT_WAIT_S = 2.0  # Ctrl+Q mid-reply: how long the stopped turn may take to hand back its reply

_ON, _OFF = {"on", "true", "yes", "1"}, {"off", "false", "no", "0"}


class ChatActions:
    """Needs the ChatApp attributes: conv, view, prompt, status, store, backend, sampling, thinking, system."""

    async def run_slash(self, text: str) -> bool:
        """Run a /command; False if the text is an ordinary message."""
        try:
            parsed = parse_slash(text)
        except SlashError as exc:
            self.notify(str(exc), severity="error")
            return True
        if parsed is None:
            return False
        cmd, arg = parsed
        handler = getattr(self, f"slash_{cmd.name}", None)
        if arg and handler is not None:
            await handler(arg)
        else:
            await self.run_action(cmd.action)
        return True

    # ----- conversation -----
    def action_stop(self) -> None:
        if not self.stop_generation():
            self.clear_code_focus()  # Esc with no reply in flight drops the code-block highlight (copying.py)

    async def _rewind(self, n: int) -> None:
        """Stop any reply in flight and drop the messages (and their widgets) from index n on."""
        if self.generating:
            self._cancel.set()
            self._turn_id += 1  # whatever the stopped turn still posts is dropped
            self.drop_reply()
        del self.conv.messages[n:]
        if self.conv.summary and n < self.conv.summary["upto"]:  # it covered messages that are gone
            self.conv.summary = {}
        widgets = list(self.view.query(".message"))
        # The context notes of the turns removed go with them (a note sits just before its turn's reply).
        first = self.view.children.index(widgets[n - 1]) + 1 if 0 < n <= len(widgets) else 0
        notes = [w for w in self.view.query(".context-note") if self.view.children.index(w) >= first
                 and not (self.conv.summary and w.has_class("summary-note"))]  # a summary still in use stays shown
        self._left_out = 0
        await self.view.remove_children(widgets[n:] + notes)

    async def action_new_chat(self) -> None:
        await self._rewind(0)
        self.conv = Conversation(model=self.conv.model, system=self.system)
        self._context_full_choice = None  # a new conversation asks again (unless the choice is remembered)
        self.status.reset_turn()
        self.status.show({"prompt_tokens": 0, "completion_tokens": 0}, state="ready" if self.ready else "loading")
        self.prompt.focus()

    async def action_regenerate(self) -> None:
        idx = self.conv.last_index("user")
        if not self.ready or idx is None:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        await self._rewind(idx + 1)
        await self.start_turn(reuse_prefix=len(self.conv.engine_messages()))

    def action_edit_last(self) -> None:
        idx = self.conv.last_index("user")
        if not self.ready or idx is None:
            self.notify("No message to edit yet.", severity="warning")
            return

        async def apply(text: str | None) -> None:
            if text is None:
                return
            if not text.strip():
                self.notify("An empty message was not sent.", severity="warning")
                return
            await self._rewind(idx)
            await self.add_user_message(text)
            await self.start_turn(reuse_prefix=len(self.conv.engine_messages()) - 1)

        self.push_screen(TextEditModal("Edit your last message", self.conv.messages[idx].content,
                                       "Ctrl+S re-runs the turn from this message · Esc cancels"), apply)

    # ----- quitting -----
    async def action_quit(self) -> None:
        """Ctrl+Q: a reply in flight is stopped and saved as cancelled first, as Esc would leave it."""
        if not self.generating:
            self.exit()
            return
        self._quitting = True
        self.stop_generation()
        # The stopped turn's ReplyDone saves it and exits (on_reply_done); a backend stuck in a step is not
        # waited for beyond QUIT_WAIT_S: what is on screen is saved then.
        self.set_timer(QUIT_WAIT_S, self._quit_now)

    def _quit_now(self) -> None:
        self.save_partial_reply()
        self.exit()

    def save_partial_reply(self) -> None:
        """Keep the reply in flight (what it streamed so far) in the conversation as cancelled, and save."""
        reply = self._reply
        if not self.generating or reply is None:
            return
        self._turn_id += 1  # the stopped turn's last messages are not applied twice
        self.conv.add("assistant", reply.text, reasoning=reply.reasoning, finish_reason="cancelled")
        self.generating, self._reply = False, None
        self.save_conversation()

    # ----- settings -----
    def show_banner(self) -> None:
        """The model, the plan, the keys, and the system prompt in force (F4 sets it)."""
        system = " ".join(self.system.split())
        if len(system) > 160:
            system = system[:159] + "…"
        self.banner.update(self._banner_text + (f"\nSystem prompt: {system}" if system else ""))

    def sampling_defaults(self) -> dict:
        """The backend's own sampling values (what an empty field means), where it tells them."""
        try:
            return dict(getattr(self.backend, "sampling_defaults", None) or {})
        except Exception:  # a backend that cannot tell: the dialog says "model default"
            return {}

    async def slash_system(self, arg: str) -> None:
        self._set_system(arg)

    def action_system_prompt(self) -> None:
        self.push_screen(TextEditModal("System prompt", self.system, "Used from the next turn · Ctrl+S save"),
                         self._set_system)

    def _set_system(self, text: str | None) -> None:
        if text is None:
            return
        self.system = self.conv.system = text.strip()
        self.show_banner()
        self.notify("System prompt set." if self.system else "System prompt cleared.")
        self.save_conversation()

    async def slash_set(self, arg: str) -> None:
        try:
            self._apply_sampling(parse_assignments(arg))
        except ValueError as exc:
            self.notify(str(exc), severity="error")

    def action_sampling(self) -> None:
        self.push_screen(SamplingModal(self.sampling, self.sampling_defaults(), self.chat_settings.context_full),
                         self._apply_sampling)

    def _apply_sampling(self, values: dict | None) -> None:
        if values is None:
            return
        context_full = values.pop("context_full", None)  # the dialog's one saved setting (overflow.py)
        if context_full is not None and context_full != self.chat_settings.context_full:
            self.set_context_full(context_full)
            self.notify(f"When the context is full: {CONTEXT_FULL_CHOICES[context_full].lower()} (saved).")
        for key, value in values.items():
            if value is None:
                self.sampling.pop(key, None)
            else:
                self.sampling[key] = value
        self.notify(f"Sampling: {describe(self.sampling)}")

    async def slash_think(self, arg: str) -> None:
        if arg.lower() not in _ON | _OFF:
            self.notify("use /think on or /think off", severity="error")
            return
        self._set_thinking(arg.lower() in _ON)

    def action_toggle_thinking(self) -> None:
        self._set_thinking(not self.thinking)

    def _set_thinking(self, on: bool) -> None:
        self.thinking = on
        self.status.show(thinking=on)
        self.notify(f"Thinking {'on' if on else 'off'} (from the next turn).")

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    # ----- output (copying: copying.py) -----
    async def slash_save(self, arg: str) -> None:
        self._save_transcript(Path(arg).expanduser())

    def action_save_transcript(self) -> None:
        self._save_transcript(None)

    def _save_transcript(self, base: Path | None) -> None:
        if not self.conv.messages:
            self.notify("Nothing to save yet.", severity="warning")
            return
        if base is None:
            base = (self.export_dir or self.store.root.parent / "transcripts") / self.conv.id
        try:
            md, js = export_transcript(self.conv, base)
        except OSError as exc:
            self.notify(f"could not save the transcript: {exc}", severity="error")
            return
        self.notify(f"Saved {md} and {js.name}", title="Transcript saved")

    def action_open_conversation(self) -> None:
        convs, skipped = self.store.list()
        if skipped:
            names = ", ".join(s.path.name for s in skipped[:3]) + (" …" if len(skipped) > 3 else "")
            self.notify(f"Skipped {len(skipped)} unreadable conversation file(s): {names}", severity="warning",
                        timeout=8)
        self.push_screen(ConversationPicker(convs, self.conv.id, delete=self.delete_conversation,
                                            rename=self.rename_conversation, keymap=self.keymap), self._open)

    async def delete_conversation(self, conv_id: str) -> None:
        """Remove a saved conversation. The open one is replaced by a new chat first: that stops a reply in
        flight, so nothing saves the old conversation again after its file is gone."""
        if conv_id == self.conv.id:
            await self.action_new_chat()
        self.store.delete(conv_id)

    def rename_conversation(self, conv_id: str, title: str) -> Conversation:
        """Retitle a saved conversation; the open one in memory too (its next save would undo it otherwise)."""
        if conv_id != self.conv.id or not self.conv.messages:
            return self.store.rename(conv_id, title)
        old, self.conv.title = self.conv.title, clean_title(title)
        try:
            self.store.save(self.conv)
        except OSError:
            self.conv.title = old  # as on disk: the picker says it failed
            raise
        return self.conv

    async def _open(self, conv_id: str | None) -> None:
        if conv_id is None:
            return
        try:
            conv = self.store.load(conv_id)
        except (OSError, ValueError) as exc:
            self.notify(f"could not open that conversation: {exc}", severity="error")
            return
        await self._rewind(0)
        self.conv, self.system = conv, conv.system
        self._context_full_choice = None
        widgets = [UserMessage(m.content) if m.role == "user" else AssistantMessage(m.content, m.reasoning,
                                                                                      m.finish_reason)
                   for m in conv.messages]
        note = self.summary_note_widget()
        if note is not None:
            widgets.insert(min(note[0], len(widgets)), note[1])
        await self.view.mount_all(widgets)
        self.view.scroll_end(animate=False)
        self.show_banner()
        self.status.reset_turn()
        self.status.show(self._context_now())
        self.notify(f"Opened “{conv.title or conv.id}”.")

    # ----- information -----
    def binding_table(self) -> list[tuple[str, str, str]]:
        rows = [(self.keymap.get(SEND_ID, SEND_DEFAULT), "Send the prompt", SEND_ID)]
        for binding in [*PromptInput.BINDINGS, *self.BINDINGS]:
            rows.append((self.keymap.get(binding.id, binding.key), binding.tooltip or binding.description,
                         binding.id or ""))
        rows.append((self.COMMAND_PALETTE_BINDING, "Command palette", ""))
        return rows

    def picker_binding_table(self) -> list[tuple[str, str, str]]:
        """The conversations list's own keys (Ctrl+O), for F1."""
        rows = []
        for b in ConversationPicker.BINDINGS:
            if b.id.startswith("picker."):
                desc = b.tooltip.removeprefix("Conversations list: ")
                rows.append((self.keymap.get(b.id, b.key), desc[:1].upper() + desc[1:], b.id))
        return rows

    def action_help(self) -> None:
        open_key = next(self.keymap.get(b.id, b.key) for b in self.BINDINGS if b.id == "chat.open")
        context_full = [(self.keymap.get(b.id, b.key), b.tooltip, b.id) for b in ContextFullModal.BINDINGS]
        self.push_screen(HelpScreen(self.binding_table(), self.picker_binding_table(), open_key, context_full))

    def action_details(self) -> None:
        stats = {**self.backend.stats(), **self.status.values}
        self.push_screen(DetailsScreen(details_markdown(self.sub_title or self.backend.label, self.backend.plan,
                                                        stats, describe(self.sampling))))
