"""Mutations of the benchmark's provenance (issue 51, items 1-2): what training and tuning record, what keeps a
result off the ranking, and what ``--verify`` checks of a submission's stamps."""

PROV = "tests/test_provenance.py"
SUB = "tests/test_bite_round48_submission.py"

MUTATIONS = [
    ("prov-test-split-ranked", "benchmark/provenance.py",
     '    if record.get("split") == "test":', "    if False:", (PROV,), "bench"),
    ("prov-test-workload-ranked", "benchmark/provenance.py",
     '    if record.get("workload") in held_out_workloads():', "    if False:", (PROV,), "bench"),
    ("prov-other-env-ranked", "benchmark/provenance.py",
     '    if record.get("env_id") != ENV_ID:', "    if False:", (PROV,), "bench"),
    ("prov-test-seed-span-off-by-one", "benchmark/provenance.py",
     "any(span[0] <= seed < span[1] for seed in TEST_SEEDS)",
     "any(span[0] <= seed < span[1] - 1 for seed in TEST_SEEDS)", (PROV,), "bench"),
    ("prov-inputs-not-inherited", "benchmark/provenance.py",
     '        reasons += [f"its {name} {why}" for why in unranked_reasons(nested)]', "        pass", (PROV,), "bench"),
    ("prov-unranked-is-a-heuristic", "benchmark/board.py",
     " or is_engine_config(label) or is_unranked(label)", " or is_engine_config(label)", (PROV,), "bench"),
    ("prov-unranked-in-ranked-table", "benchmark/board.py",
     "if not (is_engine_config(s.policy) or is_unranked(s.policy))", "if not is_engine_config(s.policy)",
     (PROV,), "bench"),
    ("prov-run-record-unread", "benchmark/bench.py",
     "unranked_reasons(record.get(RECORD)) if record else []", "[]", (PROV,), "bench"),
    ("prov-training-record-drops-workload", "rl/train.py",
     'cfg.workload or cfg.env.get("workload")', 'cfg.env.get("workload")', (PROV,), "bench"),
    ("verify-seeds-unchecked", "benchmark/submission.py",
     '    if list(data["seeds"]) != list(seeds):', "    if False:", (SUB,), "bench"),
    ("verify-track-unchecked", "benchmark/submission.py",
     '"env_id": ENV_ID, "track": TEST_TRACK}', '"env_id": ENV_ID}', (SUB,), "bench"),
    ("verify-commit-unchecked", "benchmark/submission.py",
     'here = {"servegym_version": __version__, "commit": source_commit(),', 'here = {"servegym_version": __version__,',
     (SUB,), "bench"),
    ("verify-training-record-unchecked", "benchmark/submission.py",
     "        if training.get(key) != data[\"training\"].get(key):", "        if False:", (SUB,), "bench"),
    ("verify-unfinished-run-passes", "benchmark/submission.py",
     '    if training["status"] != "finished":', "    if False:", (SUB,), "bench"),
    ("verify-dirty-record-passes", "benchmark/submission.py",
     '    problems += [f"training: {why}" for why in unranked_reasons(training[RECORD])]', "    pass", (SUB,), "bench"),
]

MUTATIONS += [
    ("prov-whole-trace-is-training-data", "benchmark/provenance.py",
     "    elif record.get(\"workload\") is not None and _outside_training_data(record[\"workload\"]):",
     "    elif False:", (PROV,), "bench"),
    ("prov-train-env-takes-a-version", "rl/config.py",
     'legacy = {"version", "id_task", "unlocked"} & set(self.env)', 'legacy = set()', (PROV,), "bench"),
    ("task-id-takes-another-version", "envs/mixture.py",
     'if kwargs.get("version", VERSION) != VERSION:', "if False:", ("tests/test_env_contract.py",), "env"),
    ("interrupted-unmarked-outside-the-cli", "benchmark/bench.py",
     'label += INTERRUPTED_MARK if record and unfinished(run) else ""', "pass", ("tests/test_train_marked.py",),
     "bench"),
    ("verify-dirty-commit-passes", "benchmark/submission.py",
     '        if str(commit).endswith("+dirty"):', "        if False:", (SUB,), "bench"),
    ("tune-study-ignores-env", "tuning/study.py",
     '    elif "env_id" not in study.user_attrs and study.get_trials(deepcopy=False):', "    elif False:",
     ("tests/test_tuning.py",), "tune"),
]
