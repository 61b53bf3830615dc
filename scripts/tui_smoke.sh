#!/usr/bin/env bash
# Real-terminal check of `qwenlocal chat` (issue 9): tmux runs it on the built-in demo model (a tiny checkpoint
# made in a temporary QWENLOCAL_HOME), types a message, waits for the reply, starts a long reply and presses
# Esc mid-reply, then quits with Ctrl+Q. The pane is captured at each step; the whole log goes to stdout and,
# if given, to the file named by $1 (e.g. docs/tui_smoke.txt).
#
# Needs tmux (apt-get install tmux). Runs on the CPU; about 30 s.
set -euo pipefail

OUT=${1:-}
command -v tmux >/dev/null || { echo "tui_smoke: needs tmux (apt-get install tmux)" >&2; exit 2; }
command -v qwenlocal >/dev/null || { echo "tui_smoke: qwenlocal is not installed (pip install -e .)" >&2; exit 2; }

WORK=$(mktemp -d)
SOCK="qwenlocal-smoke-$$"  # a private tmux server: its options and sessions never touch the user's
T=(tmux -L "$SOCK")
LOG="$WORK/log.txt"
cleanup() { "${T[@]}" kill-server 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

say() { echo "$*" | tee -a "$LOG"; }
capture() {  # capture TITLE: the visible pane as plain text
    say ""
    say "===== $1 ($(date +%T)) ====="
    "${T[@]}" capture-pane -p -t smoke | tee -a "$LOG"
}
wait_for() {  # wait_for REGEX SECONDS: until the pane shows REGEX
    local deadline=$((SECONDS + $2))
    until "${T[@]}" capture-pane -p -t smoke | grep -Eq "$1"; do
        if ((SECONDS > deadline)); then
            capture "TIMEOUT waiting for /$1/"
            exit 1
        fi
        sleep 0.2
    done
}

say "tui_smoke: qwenlocal chat on the demo model, QWENLOCAL_HOME=$WORK/home, tmux $(tmux -V | cut -d' ' -f2), 100x30"
"${T[@]}" -f /dev/null new-session -d -s smoke -x 100 -y 30 \
    "QWENLOCAL_HOME='$WORK/home' qwenlocal chat --device cpu --max-tokens 48 --seed 2; echo \"qwenlocal exit code: \$?\"; sleep 60"
# Textual tells a lone Esc from an escape sequence by timing; tmux's default 500 ms hold would blur that.
"${T[@]}" set-option -s escape-time 10

wait_for "Enter sends" 180  # the loading screen is gone and the banner is up
capture "1. loaded"

"${T[@]}" send-keys -t smoke -l "Hello! Who are you?"
"${T[@]}" send-keys -t smoke Enter
wait_for "^ *ready │.*ctx [1-9]" 180  # ready again, with the turn's context in the status bar: the reply is done
capture "2. first reply done"

# A long reply (up to 4000 tokens), stopped with Esc once it is streaming. The demo model has random weights and
# may end a reply early; if it ends before the Esc lands, ask again (3 tries).
"${T[@]}" send-keys -t smoke -l "/set max_tokens=4000"
"${T[@]}" send-keys -t smoke Enter
stopped=0
for try in 1 2 3; do
    sleep 0.5
    "${T[@]}" send-keys -t smoke -l "Now tell me a very long story (try $try)."
    "${T[@]}" send-keys -t smoke Enter
    wait_for "^ *generating │.*tok/s" 60
    capture "3.$try mid-reply, just before Esc"
    "${T[@]}" send-keys -t smoke Escape
    wait_for "^ *(stopped|ready) │" 60
    if "${T[@]}" capture-pane -p -t smoke | grep -Eq "^ *stopped │"; then
        stopped=1
        break
    fi
    say "(the reply ended before Esc; asking again)"
done
capture "4. after Esc"
((stopped)) || { say "tui_smoke: FAILED (Esc never landed mid-reply)"; exit 1; }

"${T[@]}" send-keys -t smoke C-q
wait_for "qwenlocal exit code" 30
capture "5. after Ctrl+Q"

saved=$(ls "$WORK/home/data/conversations" 2>/dev/null | wc -l)
say ""
say "conversations saved under QWENLOCAL_HOME: $saved"
grep -q "qwenlocal exit code: 0" "$LOG" || { say "tui_smoke: FAILED (non-zero exit)"; exit 1; }
say "tui_smoke: OK"
if [[ -n "$OUT" ]]; then
    mkdir -p "$(dirname "$OUT")"
    cp "$LOG" "$OUT"
fi
