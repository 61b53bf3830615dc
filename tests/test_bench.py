"""The bench: statistics on recorded numbers (the seeds' ladder), the rotating schedule, arms, derived figures,
the protocol loop with fake sessions (a peer-engine arm included), the JSON record, and an end-to-end run on
the demo model on the CPU that `--compare` reads back."""
import json
import math

import pytest

from qwenlocal.app.cli import main
from qwenlocal.engine.bench import arms as arms_mod
from qwenlocal.engine.bench.arms import Arm, parse_arm, parse_arms, parse_spec, register_arm
from qwenlocal.engine.bench.protocol import build_cases, derive, parse_tokens, prompt_ids, run_protocol
from qwenlocal.engine.bench.record import build_record, compare, load_record, write_record
from qwenlocal.engine.bench.stats import median, rotation, schedule, summarize, table
from qwenlocal.engine.errors import OptionError

# Seed 000's ladder, decode at 16K, 3 pairs: L2 143.6 (142.0) [137.9-144.6], L3 148.6 (144.9) [135.5-150.5];
# "the first pair was slower than its reference (135.5 vs 137.9); the other two were faster".
L2 = {0: 137.9, 1: 143.6, 2: 144.6}
L3 = {0: 135.5, 1: 148.6, 2: 150.5}


def _trials(values: dict, ttft: dict | None = None):
    out = []
    for arm, per_pair in values.items():
        for pair, v in per_pair.items():
            m = {"decode_tok_s": v, "ttft_s": (ttft or {}).get(arm, {}).get(pair)}
            out.append({"pair": pair, "case": "16k", "arm": arm, "warmup": False, "metrics": m})
    out.append({"pair": 0, "case": "16k", "arm": "L3", "warmup": True, "metrics": {"decode_tok_s": 1.0}})
    return out


def test_summary_reproduces_the_seed_ladder():
    rows = {(r.arm, r.metric): r for r in table(_trials({"L2": L2, "L3": L3}), ["L2", "L3"])}
    l2, l3 = rows["L2", "decode_tok_s"], rows["L3", "decode_tok_s"]
    assert l2.summary.fmt() == "143.6 (142.0) [137.9-144.6]"
    assert l3.summary.fmt() == "148.6 (144.9) [135.5-150.5]"  # the warm-up trial (1.0) is left out
    assert [round(r, 4) for r in l3.ratios] == [0.9826, 1.0348, 1.0408]
    assert l3.better == 2 and l2.ratios == () and round(l3.ratio.median, 4) == 1.0348
    assert ("L2", "ttft_s") not in rows  # a metric no trial has gets no row


def test_lower_is_better_for_ttft_and_medians():
    rows = table(_trials({"a": {0: 1, 1: 1}, "b": {0: 1, 1: 1}},
                         {"a": {0: 2.0, 1: 2.0}, "b": {0: 1.0, 1: 3.0}}), ["a", "b"])
    ttft_b = next(r for r in rows if r.arm == "b" and r.metric == "ttft_s")
    assert ttft_b.ratios == (0.5, 1.5) and ttft_b.better == 1
    assert median([4, 1, 3, 2]) == 2.5 and median([3, 1, 2]) == 2
    assert summarize([]).n == 0 and summarize([]).fmt() == "-" and summarize([None, 2.0]).n == 1
    assert summarize([]).as_dict()["median"] is None  # strict JSON: no NaN


def test_rotating_order():
    assert [rotation("ABC", p) for p in range(4)] == [list("ABC"), list("BCA"), list("CAB"), list("ABC")]
    plan = schedule(["A", "B"], ["1k", "16k"], 3)
    assert plan[:4] == [(0, "1k", "A"), (0, "1k", "B"), (0, "16k", "A"), (0, "16k", "B")]
    assert plan[4:6] == [(1, "1k", "B"), (1, "1k", "A")]
    firsts = [rotation("ABC", p)[0] for p in range(3)]
    assert sorted(firsts) == ["A", "B", "C"]  # over n pairs every arm leads once


def test_arms_registry_and_ad_hoc_arms():
    assert [a.name for a in parse_arms("baseline,chunk-512")] == ["baseline", "chunk-512"]
    small = parse_arm("small:prefill_chunk=256,cuda_graphs=false")
    assert small.options == {"prefill_chunk": 256, "cuda_graphs": False}
    assert small.engine_options({"routing": {"preset": "calibrated-28"}}).routing == {"preset": "calibrated-28"}
    with pytest.raises(OptionError, match="unknown engine option"):
        parse_arm("x:warp=9")
    with pytest.raises(OptionError, match="no bench arm"):
        parse_arms("nope")
    with pytest.raises(OptionError, match="named twice"):
        parse_arms("baseline,baseline")
    with pytest.raises(OptionError, match="already registered"):
        register_arm(Arm("baseline"))
    assert parse_spec("preset=calibrated-28,seed=3,reuse=0.7") == {"preset": "calibrated-28", "seed": 3, "reuse": 0.7}
    assert parse_spec('{"a": [1, 2]}') == {"a": [1, 2]} and parse_spec(None) is None


def test_cases_and_token_counts():
    assert [parse_tokens(t) for t in ("16k", "120k", "1.5k", "500")] == [16384, 122880, 1536, 500]
    cases = build_cases([1024, 16384], [65536], 128)
    assert [(c.name, c.prompt_tokens, c.output_tokens) for c in cases] == [
        ("1k", 1024, 128), ("16k", 16384, 128), ("ttft-64k", 65536, 1)]
    with pytest.raises(OptionError):
        parse_tokens("lots")
    assert prompt_ids(0, 1, 0, 50, 1000) == prompt_ids(0, 1, 0, 50, 1000) != prompt_ids(0, 2, 0, 50, 1000)


def test_derived_figures_and_the_roofline():
    raw = {"ttft_s": 2.0, "decode_s": 0.5, "decode_steps": 10, "prompt_tokens": 16384,
           "stats_decode": {"offload.hits": 2880, "offload.misses": 320, "offload.h2d_bytes": 320 * 1_781_760}}
    m = derive(raw, bandwidth_gbps=50.0)
    assert m["decode_tok_s"] == 20.0 and m["prefill_tok_s"] == 8192.0 and m["hit_rate"] == 0.9
    assert m["misses_per_token"] == 32 and m["h2d_bytes_per_token"] == 32 * 1_781_760
    assert math.isclose(m["roofline_tok_s"], 50e9 / (32 * 1_781_760))
    raw["stats_decode"]["gpu_s"] = 0.1  # device time 10 ms/token is the slower bound here
    assert math.isclose(derive(raw, 50.0)["roofline_tok_s"], 100.0)
    bare = derive({"ttft_s": 1.0, "decode_s": 1.0, "decode_steps": 7, "prompt_tokens": 10})
    assert bare["roofline_tok_s"] is None and bare["hit_rate"] is None


class FakeSession:
    """A deterministic engine: decode speed from its arm, plus a record of every prompt it saw."""

    def __init__(self, name, speed, log):
        self.name, self.speed, self.log = name, speed, log
        self.max_context, self.vocab_size = 4096, 1000

    def trial(self, prompt, output_tokens):
        self.log.append((self.name, tuple(prompt), output_tokens))
        return {"ttft_s": len(prompt) / 1e5, "decode_s": (output_tokens - 1) / self.speed,
                "decode_steps": output_tokens - 1, "prompt_tokens": len(prompt),
                "stats_decode": {"hits": 90, "misses": 10}, "stats": {"h2d_gbps": 40.0}}

    def describe(self):
        return {"plan": {"engine": self.name}}

    def close(self):
        pass


class PeerRunner:
    """A peer engine as an arm: anything with open(...) -> session."""

    def __init__(self, log):
        self.log = log

    def open(self, model, *, device, dtype, vram_budget, options):
        return FakeSession("peer", 120.0, self.log)


def test_protocol_interleaves_with_the_same_prompts_and_a_peer_arm():
    log = []
    arms = [Arm("baseline"), Arm("fast", {"prefill_chunk": 512}), Arm("peer", runner=PeerRunner(log))]
    speeds = {"baseline": 100.0, "fast": 110.0}

    def opener(arm):
        if arm.runner:
            return arm.runner.open("m", device=None, dtype=None, vram_budget=None, options=arm.engine_options())
        return FakeSession(arm.name, speeds[arm.name], log)

    cases = build_cases([1024, 8192], [], 8)  # 8k + 8 does not fit the fake's 4,096 context: skipped
    trials = []
    out = run_protocol(arms, cases, opener, pairs=3, warmup_s=0, seed=1, trials=trials)
    assert out["skipped"][0]["case"] == "8k" and out["warmup_trials"] == 3
    measured = [t for t in trials if not t["warmup"]]
    assert [t["arm"] for t in measured] == ["baseline", "fast", "peer", "fast", "peer", "baseline",
                                            "peer", "baseline", "fast"]
    prompts = {}
    for i, (name, prompt, _) in enumerate(log[3:]):
        prompts.setdefault(i // 3, set()).add(prompt)
    assert len(prompts) == 3 and all(len(p) == 1 for p in prompts.values()), "one prompt per pair, for every arm"
    assert len(set.union(*prompts.values())) == 3  # and a fresh one per pair
    rows = {(r.arm, r.metric): r for r in table(trials, [a.name for a in arms])}
    assert rows["fast", "decode_tok_s"].ratios == pytest.approx((1.1, 1.1, 1.1))
    assert rows["peer", "hit_rate"].summary.median == 0.9
    assert ("peer", "roofline_tok_s") not in rows  # a bandwidth but no H2D bytes: no roofline
    assert out["arms"]["peer"] == {"plan": {"engine": "peer"}}


def test_record_round_trip_and_compare(tmp_path):
    arms = [Arm("L2"), Arm("L3")]
    cases = build_cases([16384], [], 128)
    rec = build_record(command=["qwenlocal", "bench"], settings={"pairs": 3, "routing": {"preset": "calibrated-28"}},
                       model={"name": "synthetic:qwen3.6-35b-a3b"}, arms=arms, arm_info={}, cases=cases,
                       trials=_trials({"L2": L2, "L3": L3}), skipped=[], profile=None, started=0.0, complete=True)
    path = write_record(rec, tmp_path)
    back = load_record(path)
    assert back["routing"] == {"preset": "calibrated-28"} and len(back["trials"]) == 7 and back["source"]["commit"]
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    faster = json.loads(json.dumps(back))
    for t in faster["trials"]:
        t["metrics"]["decode_tok_s"] *= 1.1
    faster["summary"] = [r.as_dict() for r in table(faster["trials"], ["L2", "L3"])]
    rows = compare(back, faster)
    assert {r["arm"]: round(r["ratio"], 3) for r in rows if r["metric"] == "decode_tok_s"} == {"L2": 1.1, "L3": 1.1}
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(OptionError, match="not a qwenlocal bench result"):
        load_record(tmp_path / "other.json")


def test_bench_end_to_end_on_the_demo_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    out = tmp_path / "results"
    args = ["bench", "--contexts", "256", "--output-tokens", "8", "--pairs", "1", "--warmup", "0",
            "--device", "cpu", "--out", str(out), "--arm", "small:prefill_chunk=64"]
    assert main(args + ["--arms", "baseline"]) == 0
    first = sorted(out.glob("*.json"))
    assert len(first) == 1
    rec = load_record(first[0])
    assert rec["complete"] and rec["model"]["kind"] == "demo" and rec["settings"]["device"] == "cpu"
    assert [a["name"] for a in rec["arms"]] == ["baseline", "small"] and rec["arms"][1]["plan"]
    measured = [t for t in rec["trials"] if not t["warmup"]]
    assert len(measured) == 2 and all(t["raw"]["decode_steps"] == 7 for t in measured)
    assert all(t["metrics"]["decode_tok_s"] > 0 and t["metrics"]["ttft_s"] > 0 for t in measured)
    assert "below the protocol" in rec["notes"][0]
    assert rec["settings"]["sampling"] == "model" and all(t["raw"]["sampling"] == "model" for t in measured)
    text = capsys.readouterr().out
    assert "chat's loop" in text
    assert "decode" in text and "roofline" in text and "small" in text
    assert main(args + ["--arms", "baseline", "--seed", "1"]) == 0
    second = sorted(set(out.glob("*.json")) - set(first))[0]
    capsys.readouterr()
    assert main(["bench", "--compare", str(first[0]), str(second)]) == 0
    shown = capsys.readouterr().out
    assert "B/A" in shown and "baseline" in shown and "small" in shown


def test_bench_list_arms_and_bad_input(capsys):
    assert main(["bench", "--list-arms"]) == 0
    assert "chunk-512" in capsys.readouterr().out
    assert main(["bench", "--arms", "nope"]) == 1
    assert main(["bench", "--contexts", "lots"]) == 1


def test_registered_arms_are_valid_options():
    for arm in arms_mod.ARMS.values():
        arm.engine_options()


def test_an_interrupted_run_keeps_what_it_measured(tmp_path, monkeypatch, capsys):
    from qwenlocal.engine.bench import measure

    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    real, calls = measure.timed_trial, []

    def stop_on_the_fourth(engine, prompt, output_tokens, *loop):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(engine, prompt, output_tokens, *loop)

    monkeypatch.setattr(measure, "timed_trial", stop_on_the_fourth)
    args = ["bench", "--contexts", "128", "--output-tokens", "4", "--pairs", "3", "--warmup", "0",
            "--device", "cpu", "--out", str(tmp_path)]
    assert main(args) == 130
    rec = load_record(next(tmp_path.glob("*.json")))
    assert not rec["complete"] and len(rec["trials"]) == 3  # 2 warm-up + the first measured one
    assert "partial result" in capsys.readouterr().out


def test_records_written_in_the_same_second_do_not_overwrite(tmp_path, monkeypatch):
    from qwenlocal.engine.bench import record as rec_mod

    monkeypatch.setattr(rec_mod, "default_name", lambda record: "same-name.json")
    a = rec_mod.write_record({"n": 1}, tmp_path)
    b = rec_mod.write_record({"n": 2}, tmp_path)
    assert a != b and json.loads(a.read_text())["n"] == 1 and json.loads(b.read_text())["n"] == 2


def test_bench_results_default_to_the_data_folder(tmp_path, monkeypatch):
    from qwenlocal.app.commands.bench import results_dir

    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    assert results_dir(None) == tmp_path / "home" / "data" / "bench"
    assert results_dir(tmp_path / "mine") == tmp_path / "mine"


def test_ratio_cells_read_plainly_and_noise_is_called_out():
    from rich.console import Console

    from qwenlocal.app.bench_view import _ratio, is_noisy, noise_notes, render_run

    steady = {"case": "16k", "metric": "decode_tok_s", "arm": "B", "ratios": [1.21, 1.19, 1.2],
              "ratio": {"median": 1.2}, "better_pairs": 3}
    wild = {"case": "16k", "metric": "decode_tok_s", "arm": "C", "ratios": [1.02, 11.4, 15.6],
            "ratio": {"median": 11.4}, "better_pairs": 3}
    slower = {"case": "1k", "metric": "decode_tok_s", "arm": "B", "ratios": [2.466, 0.637, 0.441],
              "ratio": {"median": 0.637}, "better_pairs": 1}
    assert _ratio(steady, "decode_tok_s") == "median 1.20, 3 of 3 pairs faster\npairs 1.21 1.19 1.20"
    assert _ratio(slower, "decode_tok_s").startswith("median 0.64, 1 of 3 pairs faster (noisy)")
    assert not is_noisy(steady["ratios"], 1.2) and is_noisy(wild["ratios"], 11.4) and not is_noisy([3.0], 3.0)
    notes = noise_notes([steady, wild, slower])
    assert len(notes) == 2 and "16k decode C" in notes[0] and "1.02-15.60 (15.3x)" in notes[0]
    console = Console(record=True, width=200)
    summary = [{**r, "summary": {"n": 3, "median": 1.0, "mean": 1.0, "min": 1.0, "max": 1.0}} for r in (steady, wild)]
    summary.append({"case": "16k", "metric": "decode_tok_s", "arm": "A", "ratios": [], "ratio": {},
                    "better_pairs": 0, "summary": {"n": 3, "median": 1.0, "mean": 1.0, "min": 1.0, "max": 1.0}})
    render_run({"summary": summary, "arms": [{"name": "A"}, {"name": "B"}, {"name": "C"}], "settings": {}}, console)
    text = console.export_text()
    assert "3 of 3 pairs faster" in text and "noise: 16k" in text and "not a result" in text


def test_both_decode_loops_make_the_asked_tokens_through_their_own_path(tiny_engine, monkeypatch):
    """'model' runs chat's generate_tokens with the checkpoint's sampling (never stopping at EOS); 'argmax' keeps
    the greedy token on the device; both make output_tokens - 1 decode steps."""
    from qwenlocal.engine.bench import measure
    from qwenlocal.engine.runtime import generate

    seen = []
    real = generate.generate_tokens

    def spy(runner, state, prompt, params, eos_ids, *a, **k):
        seen.append((params, eos_ids))
        return real(runner, state, prompt, params, eos_ids, *a, **k)

    monkeypatch.setattr(generate, "generate_tokens", spy)
    prompt = list(range(5, 30))
    model = measure.timed_trial(tiny_engine, prompt, 6, "model", tiny_engine.tokenizer.vocab_size)
    assert model["decode_steps"] == 5 and model["sampling"] == "model"
    params, eos = seen[0]
    assert eos == () and params.max_tokens == 6 and params.seed == 0
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 0.95, 20)  # the checkpoint's
    greedy = measure.timed_trial(tiny_engine, prompt, 6, "argmax")
    assert greedy["decode_steps"] == 5 and len(seen) == 1
    with pytest.raises(OptionError, match="argmax"):
        measure.timed_trial(tiny_engine, prompt, 6, "beam")
