"""Training that tells the truth after any stop (config.json, exit status, workers, whole checkpoints)."""

STOP = "tests/test_train_stop.py"
CHECKPOINT = STOP + "::test_a_signal_during_a_checkpoint_waits_for_the_whole_checkpoint"
CRASH = STOP + "::test_a_crash_while_learning_is_recorded_as_failed_with_the_steps_done"
SAVING = STOP + "::test_a_first_signal_in_a_saving_block_waits_for_its_end_and_a_second_does_not"
IGNORED = STOP + "::test_an_ignored_signal_stays_ignored"
WORKERS = STOP + "::test_a_stop_during_env_setup_ends_every_worker_it_started"
CLI_SETUP = STOP + "::test_sigterm_during_env_setup_exits_143_and_leaves_no_process"
RESUME = "tests/test_train_resume.py::test_config_is_written_before_training_starts_and_a_crash_is_recorded_as_failed"

MUTATIONS = [
    ("lifecycle-interrupted-left-running", "rl/train.py", 'self.write(status="interrupted", interrupted=True,',
     'self.write(status="running", interrupted=True,', (CHECKPOINT,), "lifecycle"),
    ("lifecycle-stop-signal-always-sigint", "rl/train.py",
     'name = err.signal_name if isinstance(err, TrainingInterrupted) else "SIGINT"', 'name = "SIGINT"',
     (CHECKPOINT,), "lifecycle"),
    ("lifecycle-timesteps-done-not-updated", "rl/train.py",
     "if self.model is None else self.model.num_timesteps", "if self.model is None else 0", (CHECKPOINT, CRASH),
     "lifecycle"),
    ("lifecycle-last-checkpoint-not-recorded", "rl/train.py",
     '"last_checkpoint": None if checkpoint is None else _relative(self.run, checkpoint)}',
     '"last_checkpoint": None}', (CHECKPOINT, CRASH), "lifecycle"),
    ("lifecycle-crash-not-recorded", "rl/train.py", "        elif isinstance(err, Exception):\n",
     "        elif False:\n", (CRASH, RESUME), "lifecycle"),
    ("lifecycle-sigterm-exit-status-130", "servegym/signals.py", "        return exit_status(self.signum)\n",
     "        return 130\n", (CHECKPOINT, SAVING), "lifecycle"),
    ("lifecycle-cli-sigterm-exits-130", "servegym/cli_train.py", "        return stop.exit_status\n    info =",
     "        return 130\n    info =", (CLI_SETUP,), "lifecycle"),
    ("lifecycle-checkpoint-torn-by-signal", "rl/train.py",
     "            with session.stop.saving():\n                return super()._on_step()",
     "            return super()._on_step()", (CHECKPOINT,), "lifecycle"),
    ("lifecycle-pending-signal-raised-twice", "rl/stopping.py", "signum, self.pending = self.pending, None",
     "signum = self.pending", (SAVING, CHECKPOINT), "lifecycle"),
    ("lifecycle-second-signal-waits", "rl/stopping.py", "if self._saving and self.pending is None:",
     "if self._saving:", (SAVING,), "lifecycle"),
    ("lifecycle-ignored-signal-caught", "servegym/signals.py", "if signal.getsignal(sig) is not signal.SIG_IGN:",
     "if True:", (IGNORED,), "lifecycle"),
    ("lifecycle-workers-not-terminated", "rl/train.py", "            process.terminate()\n",
     "            pass\n", (WORKERS,), "lifecycle"),
    ("lifecycle-forkserver-workers", "rl/train.py", 'SubprocVecEnv(factories, start_method="spawn")',
     "SubprocVecEnv(factories)", (WORKERS,), "lifecycle"),
    ("lifecycle-resume-keeps-old-stop", "rl/train.py",
     '("timesteps_done", "wall_s", "best_mean_reward", "best_timesteps", RECORD)',
     '("timesteps_done", "wall_s", "best_mean_reward", "best_timesteps", RECORD, "stopped_by")', (CHECKPOINT,),
     "lifecycle"),
]
MUTATIONS += [
    ("lifecycle-tuning-episode-unchecked", "tuning/study.py",
     "result = run_episode(e, p, seed=seed, checkpoint=checkpoint)", "result = run_episode(e, p, seed=seed)",
     ("tests/test_tuning.py::test_a_stop_request_reaches_inside_an_episode",), "lifecycle"),
]
