"""A conversation that outgrows the context: ask once (ContextFullModal), then drop or summarise the oldest turns
of what is sent. A mixin of ChatApp; the fitting rule is context.py, the summary request summary.py.

The choice: the settings file's `context_full` when it is not "ask" (remembered), else the one made in this
conversation, else the modal asks. `_fit` runs on the turn's worker thread and only posts messages; the
handlers below touch the widgets.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from textual.widgets import Static

from . import messages as msg
from .context import (REPLY_ROOM, ContextTooLong, fit_to_context, split_turns, summary_budget, turns_to_fold,
                      with_summary)
from .modals import ContextFullModal
from .settings import save_chat_settings
from .summary import SummaryFailed, summary_request, write_summary


@dataclass
class SendPlan:
    """What a turn sends, taken on the UI thread when it starts (the worker must not read the conversation)."""
    messages: list[dict]  # the system prompt and the history the summary does not cover, the new message last
    indices: list[int]  # the conversation index of each history message in `messages` (the system one has none)
    summary: dict  # conversation.summary, or {}
    policy: str  # "ask" | "drop" | "summarise"
    summary_cancel: threading.Event  # Esc while summarising: drop instead


def _turns(n: int) -> str:
    return f"{n} oldest turn{'s' if n != 1 else ''}"


class ContextFullActions:
    """Needs the ChatApp attributes: conv, view, prompt, status, backend, chat_settings, settings_path."""

    # ----- on the UI thread: what to send -----
    def context_full_policy(self) -> str:
        remembered = self.chat_settings.context_full
        return remembered if remembered != "ask" else (self._context_full_choice or "ask")

    def send_plan(self, summary_cancel: threading.Event | None = None) -> SendPlan:
        summary = dict(self.conv.summary)
        start = summary.get("upto", 0) if summary else 0
        sent = self.conv.sent_messages(start=start)
        head = [{"role": "system", "content": self.conv.system}] if self.conv.system else []
        return SendPlan(head + [m for _, m in sent], [i for i, _ in sent], summary, self.context_full_policy(),
                        summary_cancel or threading.Event())

    def messages_to_send(self) -> list[dict]:
        """The history as the next turn starts from (with the summary in place of the turns it covers)."""
        plan = self.send_plan()
        return with_summary(plan.messages, plan.summary["text"]) if plan.summary else plan.messages

    # ----- on the worker thread -----
    def _fit(self, turn_id: int, plan: SendPlan, thinking: bool, reuse_prefix: int) -> tuple[list[dict], int] | None:
        """What to send, or None when the user must choose first (ContextFull posted). Raises ContextTooLong."""
        count = getattr(self.backend, "count_tokens", None)
        limit = getattr(self.backend, "context_limit", None)
        msgs = with_summary(plan.messages, plan.summary["text"]) if plan.summary else plan.messages
        tokens = count(msgs, thinking) if count is not None and limit else None
        if tokens is None:
            return msgs, reuse_prefix

        def measure(m):
            return count(m, thinking)

        if plan.summary:
            reuse_prefix = 0  # what is sent no longer lines up with the saved history's indices
        if tokens + min(REPLY_ROOM, limit // 4) <= limit:
            return msgs, reuse_prefix
        dropped = fit_to_context(msgs, measure, limit, tokens=tokens)  # ContextTooLong: refused whatever the choice
        if plan.policy == "ask":
            self.post_message(msg.ContextFull(turn_id, dropped.dropped_turns, tokens, limit))
            return None
        if plan.policy == "summarise":
            try:
                return self._summarise(turn_id, plan, measure, limit), 0
            except SummaryFailed as exc:
                self.post_message(msg.ContextTrimmed(turn_id, dropped.dropped_turns, dropped.tokens,
                                                     reason=f"summarising failed: {exc}"))
                return dropped.messages, 0
        self.post_message(msg.ContextTrimmed(turn_id, dropped.dropped_turns, dropped.tokens))
        return dropped.messages, 0

    def _summarise(self, turn_id: int, plan: SendPlan, measure, limit: int) -> list[dict]:
        """Fold the previous summary and the oldest turns into a new one; what to send with it."""
        try:
            n = turns_to_fold(plan.messages, measure, limit)
        except ContextTooLong:
            raise SummaryFailed("no room for a summary beside the new message") from None
        folded, rest, cut = split_turns(plan.messages, n)
        budget = summary_budget(limit)
        request = summary_request(plan.summary.get("text", ""), folded, budget, measure, limit)
        turns = plan.summary.get("turns", 0) + n
        self.post_message(msg.SummaryStarted(turn_id, turns))
        summary = write_summary(self.backend, request, budget, plan.summary_cancel)
        fitted = fit_to_context(with_summary(rest, summary.text), measure, limit)  # a summary over budget: drops more
        head = len(plan.messages) - len(plan.indices)
        new = {"upto": plan.indices[cut - head], "text": summary.text, "tokens": summary.tokens, "turns": turns}
        self.post_message(msg.Summarised(turn_id, new, fitted.dropped_turns, fitted.tokens))
        return fitted.messages

    # ----- on the UI thread: the handlers -----
    def _note(self, text: str, reply, *classes: str) -> None:
        self.view.mount(Static(text, classes=" ".join(("context-note", *classes)), markup=False), before=reply)

    def on_context_full(self, m: msg.ContextFull) -> None:
        if self._current(m.turn_id) is None:
            return
        turn_id = m.turn_id

        async def chosen(result: tuple[str, bool] | None) -> None:
            if turn_id != self._turn_id or self._reply is None:
                return
            await self._reply.remove()
            self.drop_reply()
            if result is None:
                await self._unsend_last_message()
                return
            choice, remember = result
            self._context_full_choice = choice
            if remember:
                self.set_context_full(choice)
            await self.start_turn()

        self.status.show(state="asking")
        self.push_screen(ContextFullModal(m.turns, m.tokens, m.limit, keymap=self.keymap), chosen)

    async def _unsend_last_message(self) -> None:
        """Cancel in the modal: the message goes back to the prompt, as if it had not been sent."""
        idx = self.conv.last_index("user")
        text = self.conv.messages[idx].content if idx is not None else ""
        if idx is not None:
            await self._rewind(idx)
        self.prompt.load_text(text)
        self.prompt.focus()
        self.status.show(self._context_now(), state="ready")
        self.save_conversation()
        self.notify("Not sent: the message is back in the prompt.")

    def set_context_full(self, choice: str) -> None:
        """Remember the choice in the settings file (F5 shows and changes it)."""
        self.chat_settings.context_full = choice
        try:
            save_chat_settings(self.settings_path, self.chat_settings)
        except OSError as exc:
            self.notify(f"could not save the settings to {self.settings_path}: {exc}", severity="error")

    def on_summary_started(self, m: msg.SummaryStarted) -> None:
        if self._current(m.turn_id) is not None:
            self._summarising = True
            self.status.show(state=f"summarising {_turns(m.turns)} (Esc: drop them instead)")

    def on_summarised(self, m: msg.Summarised) -> None:
        self._summarising = False
        reply = self._current(m.turn_id)
        if reply is None:
            return
        self.conv.summary = m.summary
        s = m.summary
        more = f"; {_turns(m.dropped).replace('oldest', 'more')} dropped to fit" if m.dropped else ""
        self._note(f"{_turns(s['turns'])} summarised ({s['tokens']} tokens){more}. Summary of earlier turns: "
                   f"{s['text']}", reply, "summary-note")
        self.notify(f"{_turns(s['turns'])} summarised ({s['tokens']} tokens)")
        self.status.show(state="generating")
        self.save_conversation()

    def on_context_trimmed(self, m: msg.ContextTrimmed) -> None:
        self._summarising = False
        reply = self._current(m.turn_id)
        if reply is None:
            return
        self.status.show(state="generating")
        if m.dropped_turns == self._left_out and not m.reason:
            return  # said already for this many
        self._left_out = m.dropped_turns
        why = f"{m.reason[:1].upper()}{m.reason[1:]}: " if m.reason else ""
        text = f"{_turns(m.dropped_turns)} dropped to fit"
        self._note(f"{why}{text} ({m.tokens} tokens sent; the saved conversation keeps everything).", reply)
        self.notify(f"{why}{text}", severity="warning" if m.reason else "information")

    def summary_note_widget(self) -> tuple[int, Static] | None:
        """For a conversation opened from disk: its summary's note, and the message index it goes before."""
        s = self.conv.summary
        if not s:
            return None
        return s["upto"], Static(f"{_turns(s['turns'])} summarised ({s['tokens']} tokens). Summary of earlier "
                                 f"turns: {s['text']}", classes="context-note summary-note", markup=False)
