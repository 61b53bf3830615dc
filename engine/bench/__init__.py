"""The benchmark protocol (DESIGN.md, Performance protocol): arms, cases, the paired rotating schedule,
statistics and the JSON record. Only measure.py touches torch, and only inside its functions.
  arms.py      Arm registry (name + EngineOptions overrides + optional runner for a peer engine)
  protocol.py  cases, seeded prompts, warm-up and pairs, derived figures per trial
  stats.py     rotation, median (mean) [min-max], per-pair ratios vs the first arm
  record.py    one JSON per run (commit, machine, plan, every raw figure), load and compare
  measure.py   a timed trial on the embedded engine (prefill + decode steps via engine.runner)
"""
