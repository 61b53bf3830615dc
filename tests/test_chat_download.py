"""`qwenlocal chat --model NAME` for a known model not downloaded: it says what the download is, asks (or --yes
decides), downloads with `download`'s code from a fake local hub (tests/fakehub.py), then the chat opens that
model: the command function runs with ChatApp replaced by a stand-in that loads the backend as the app's loader
thread does (a real engine load of the downloaded checkpoint), instead of starting the TUI."""
import io
import shutil
import sys

import pytest

from fakehub import install
from qwenlocal.app import hub
from qwenlocal.app.cli import main
from qwenlocal.app.commands.chat_download import _ask
from qwenlocal.engine.errors import QwenlocalError
from qwenlocal.engine.probe.fake import fake_gpu_profile, h200

NVFP4 = "qwen3.6-35b-a3b-nvfp4"
NVFP4_REPO = "nvidia/Qwen3.6-35B-A3B-NVFP4"
BF16_REPO = "Qwen/Qwen3.6-35B-A3B"


class Terminal(io.StringIO):
    def isatty(self):
        return True


class FakeChatApp:
    """ChatApp's surface that commands/chat.py uses; run() loads the backend the way the app's worker does."""
    made: list["FakeChatApp"] = []

    def __init__(self, backend, **kwargs):
        self.backend, self.kwargs = backend, kwargs
        self.load_error, self.return_code = None, None
        FakeChatApp.made.append(self)

    def run(self):
        try:
            self.backend.load(lambda *a: None)
        except QwenlocalError as exc:
            self.load_error, self.return_code = str(exc), 1


@pytest.fixture()
def fake(monkeypatch, tiny_ckpt, tmp_path):
    remote = tmp_path / "remote"
    shutil.copytree(tiny_ckpt, remote)
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: h200())
    monkeypatch.setattr(hub, "free_disk_bytes", lambda path: 10**15)
    monkeypatch.setattr("qwenlocal.app.chat.app.ChatApp", FakeChatApp)
    FakeChatApp.made = []
    fh = install(monkeypatch, {NVFP4_REPO: remote, BF16_REPO: remote}, tmp_path / "hf-cache")
    fh.size = sum(p.stat().st_size for p in remote.iterdir() if p.is_file())
    return fh


def _fetched(fake):
    return [c for c in fake.calls if not c["local_files_only"] and not c["dry_run"]]


def test_yes_downloads_then_the_chat_opens_the_downloaded_model(fake, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: --yes decides
    assert main(["chat", "--model", NVFP4, "--yes"]) == 0
    err = capsys.readouterr().err
    assert "not downloaded yet" in err and "Fit check" in err and str(fake.cache) in err and "Ready" in err
    assert fake.transferred == fake.size and len(_fetched(fake)) == 1
    (app,) = FakeChatApp.made
    assert app.load_error is None and app.backend._engine is not None
    assert app.backend.label.startswith(NVFP4_REPO)
    assert str(app.backend._engine.model_dir) == str(hub.find_cached(NVFP4_REPO).path)
    assert str(app.backend._engine.model_dir).startswith(str(fake.cache))
    # Downloaded now: the next chat neither asks nor contacts the hub.
    fake.calls.clear()
    assert main(["chat", "--model", NVFP4]) == 0
    assert all(c["local_files_only"] for c in fake.calls) and "not downloaded" not in capsys.readouterr().err
    assert len(FakeChatApp.made) == 2 and FakeChatApp.made[1].backend._engine is not None


def test_a_terminal_is_asked_and_yes_downloads(fake, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert main(["chat", "--model", NVFP4]) == 0
    err = capsys.readouterr().err
    assert "GB) and start the chat? [y/N]" in err and "Ready" in err
    assert fake.transferred == fake.size and FakeChatApp.made[0].backend._engine is not None


@pytest.mark.parametrize("answer", ["n\n", "\n", ""])
def test_a_terminal_that_says_no_downloads_nothing(fake, capsys, monkeypatch, answer):
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    assert main(["chat", "--model", NVFP4]) == 1
    err = capsys.readouterr().err
    assert "[y/N]" in err and f"not downloaded. `qwenlocal download {NVFP4}`" in err
    assert not _fetched(fake) and fake.transferred == 0 and not FakeChatApp.made
    assert hub.find_cached(NVFP4_REPO) is None


def test_not_a_terminal_without_yes_refuses_and_says_what_to_run(fake, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # piped input is not an answer
    assert main(["chat", "--model", NVFP4]) == 1
    err = capsys.readouterr().err
    assert f"run `qwenlocal download {NVFP4}` first, or pass --yes" in err and "[y/N]" not in err
    assert all(c["local_files_only"] for c in fake.calls), "refusing must not wait on the hub"
    assert fake.transferred == 0 and not FakeChatApp.made


def test_what_does_not_fit_says_so_before_asking_and_needs_force(fake, capsys, monkeypatch):
    # The BF16 checkpoint with 32 GB of RAM: the 60 GiB bank cannot be held.
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: fake_gpu_profile(ram_total=32.0))
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert main(["chat", "--model", "qwen3.6-35b-a3b"]) == 1
    err = capsys.readouterr().err
    assert "does not fit" in err and "--force downloads it anyway" in err and NVFP4_REPO in err
    assert "[y/N]" not in err and not _fetched(fake) and not FakeChatApp.made
    # --force downloads it; the chat's own check before loading still stops it, with the same reason.
    assert main(["chat", "--model", "qwen3.6-35b-a3b", "--force", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "--force: downloading anyway" in err and fake.transferred == fake.size
    (app,) = FakeChatApp.made
    assert app.load_error and "does not fit" in app.load_error and app.backend._engine is None


def test_unknown_names_fail_before_the_tui_with_the_known_names(fake, capsys):
    assert main(["chat", "--model", "qwen9-huge"]) == 1
    err = capsys.readouterr().err
    assert "qwen9-huge" in err and NVFP4 in err and "qwen3.6-35b-a3b" in err
    assert not FakeChatApp.made and not _fetched(fake)


def test_a_hub_that_cannot_be_reached_is_a_clear_error_before_anything(fake, capsys, monkeypatch):
    fake.online = False
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert main(["chat", "--model", NVFP4]) == 1
    err = capsys.readouterr().err
    assert "hub is unreachable" in err or "cannot download" in err
    assert "[y/N]" not in err and not FakeChatApp.made


def test_ask_reads_one_answer():
    from rich.console import Console

    console = Console(file=io.StringIO())
    assert _ask(console, "go? [y/N] ", io.StringIO("Yes\n")) is True
    assert _ask(console, "go? [y/N] ", io.StringIO("no\n")) is False
    assert _ask(console, "go? [y/N] ", io.StringIO("")) is False
    assert "go? [y/N]" in console.file.getvalue()


def test_a_download_cut_short_is_offered_again_and_resumes(fake, capsys, monkeypatch):
    fake.fail_after_bytes = fake.size // 2
    with pytest.raises(hub.HubError):
        hub.download(NVFP4_REPO, progress=False)
    sent = fake.transferred
    fake.fail_after_bytes = None
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["chat", "--model", NVFP4, "--yes"]) == 0
    assert "only partly downloaded" in capsys.readouterr().err
    assert fake.transferred == fake.size and sent > 0  # resumed: the first half was not sent again
    assert FakeChatApp.made[0].backend._engine is not None
