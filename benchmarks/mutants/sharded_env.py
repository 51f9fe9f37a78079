"""Mutations of the sharded vector env (issue 53): the shard bounds, the shared step arrays, the infos' places,
the Disabled autoreset, errors from workers, a dead worker and Ctrl-C."""

SHARDED = "tests/test_sharded_env.py"

MUTATIONS = [
    ("sharded-bounds-floored", "envs/sharded.py",
     "np.linspace(0, self.num_envs, int(shards) + 1).round().astype(int)",
     "np.linspace(0, self.num_envs, int(shards) + 1).astype(int)", (SHARDED,), "env"),
    ("sharded-actions-not-shared", "envs/sharded.py",
     '            self._step["actions"][...] = batch\n', "            pass\n", (SHARDED,), "env"),
    ("sharded-worker-rewards-not-written", "envs/sharded.py",
     '                shared["rewards"][...], shared["terminations"][...] = rewards, terminations',
     '                shared["terminations"][...] = terminations', (SHARDED,), "env"),
    ("sharded-local-truncations-not-copied", "envs/sharded.py",
     "                self._rewards[:k], self._terminations[:k], self._truncations[:k] = rewards, terminations, "
     "truncations",
     "                self._rewards[:k], self._terminations[:k] = rewards, terminations", (SHARDED,), "env"),
    ("sharded-worker-infos-at-the-start", "envs/sharded.py",
     "        self.env_infos[start: start + len(infos)] = infos",
     "        self.env_infos[: len(infos)] = infos", (SHARDED,), "env"),
    ("sharded-disabled-steps-an-ended-episode", "envs/sharded.py",
     "            self._ended |= self._terminations | self._truncations\n", "            pass\n", (SHARDED,), "env"),
    ("sharded-worker-traceback-dropped", "envs/sharded.py",
     "                exception.add_note(", "                (lambda _: None)(", (SHARDED,), "env"),
    ("sharded-dead-worker-forgotten", "envs/sharded.py",
     "        self._failure = (f\"the worker", "        _unused = (f\"the worker", (SHARDED,), "env"),
    ("sharded-worker-dies-on-ctrl-c", "envs/sharded.py",
     "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n", "", (SHARDED,), "env"),
]
