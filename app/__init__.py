"""qwenlocal.app: the user-facing side (CLI, chat TUI, bench). Never imports torch at import time."""
