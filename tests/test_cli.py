"""The `qwenlocal` command line: help, placeholders that say what is missing, and a real generate run."""
import subprocess
import sys


from qwenlocal.app.cli import main


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "qwenlocal.app.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_help_lists_every_subcommand():
    out = run_cli("--help")
    assert out.returncode == 0
    for name in ("chat", "bench", "probe", "download", "generate", "models"):
        assert name in out.stdout


def test_app_side_does_not_import_torch():
    code = "import sys, qwenlocal.app.cli as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_generate_streams_a_reply_from_a_checkpoint(tiny_ckpt, tmp_path):
    import os

    env = dict(os.environ, QWENLOCAL_HOME=str(tmp_path))
    out = run_cli("generate", "Hello", "--model", str(tiny_ckpt), "--max-tokens", "8", "--seed", "1",
                  "--device", "cpu", env=env)
    assert out.returncode == 0, out.stderr
    assert "tokens, TTFT" in out.stderr


def test_generate_with_a_bad_model_path_is_a_clear_error(tmp_path):
    assert main(["generate", "hi", "--model", str(tmp_path / "nope")]) == 1


def test_demo_model_is_generated_once_and_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path))
    from qwenlocal.app.models import resolve_model

    first = resolve_model(None)
    assert first.is_demo and (first.path / "config.json").is_file()
    stamp = (first.path / "config.json").stat().st_mtime_ns
    assert resolve_model(None).path == first.path
    assert (first.path / "config.json").stat().st_mtime_ns == stamp
    assert not [p for p in first.path.parent.iterdir() if p.name.startswith(".")]


def test_threads_option_on_every_engine_command(capsys):
    import pytest

    from qwenlocal.app.cli import build_parser
    from qwenlocal.app.commands import thread_options

    parser = build_parser()
    for cmd in (["chat"], ["generate", "hi"], ["serve"], ["bench"]):
        args = parser.parse_args([*cmd, "--threads", "3"])
        assert thread_options(args) == {"threads": 3}, cmd
        assert thread_options(parser.parse_args(cmd)) is None
        for bad in ("0", "two"):
            with pytest.raises(SystemExit):
                parser.parse_args([*cmd, "--threads", bad])
    assert "--threads" in capsys.readouterr().err


def test_generate_threads_reach_torch(tiny_ckpt, tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path))
    before = torch.get_num_threads()
    try:
        assert main(["generate", "Hello", "--model", str(tiny_ckpt), "--max-tokens", "2", "--device", "cpu",
                     "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_generate_context_overflow_advises_about_the_prompt(tiny_ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path))
    assert main(["generate", "word " * 3000, "--model", str(tiny_ckpt), "--device", "cpu", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "the prompt does not fit" in err and "shorten the prompt" in err and "new chat" not in err
