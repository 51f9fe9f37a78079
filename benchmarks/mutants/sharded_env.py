"""Mutations of the sharded vector env (issue 53): the shard bounds, the shared step arrays, the infos' places,
the Disabled autoreset, errors from workers, a dead worker, Ctrl-C, an interrupted call, answers that do not
pickle, a failed build or close."""

SHARDED = "tests/test_sharded_env.py"

MUTATIONS = [
    ("sharded-bounds-floored", "envs/sharded.py",
     "np.linspace(0, self.num_envs, int(shards) + 1).round().astype(int)",
     "np.linspace(0, self.num_envs, int(shards) + 1).astype(int)", (SHARDED,), "env"),
    ("sharded-actions-not-shared", "envs/sharded.py",
     '            self._step["actions"][...] = rows\n', "            pass\n", (SHARDED,), "env"),
    ("sharded-worker-rewards-not-shared", "envs/sharded.py",
     '        vector.use_buffer(_attach(tree, start, stop), shared["rewards"], shared["terminations"],',
     '        vector.use_buffer(_attach(tree, start, stop), None, shared["terminations"],', (SHARDED,), "env"),
    ("sharded-local-truncations-not-shared", "envs/sharded.py",
     "self._terminations[:k], self._truncations[:k])", "self._terminations[:k], None)", (SHARDED,), "env"),
    ("sharded-worker-infos-at-the-start", "envs/sharded.py",
     "        self.env_infos[start: start + len(infos)] = infos",
     "        self.env_infos[: len(infos)] = infos", (SHARDED,), "env"),
    ("sharded-disabled-steps-an-ended-episode", "envs/sharded.py",
     "            self._ended |= self._terminations | self._truncations\n", "            pass\n", (SHARDED,), "env"),
    ("sharded-worker-traceback-dropped", "envs/sharded.py",
     "                exception.add_note(", "                (lambda _: None)(", (SHARDED,), "env"),
    ("sharded-dead-worker-forgotten", "envs/sharded.py",
     "        self._failure = (f\"the worker", "        _unused = (f\"the worker", (SHARDED,), "env"),
    ("sharded-shared-actions-not-copied", "envs/sharded.py",
     'shared["actions"].copy() if args is None', 'shared["actions"] if args is None', (SHARDED,), "env"),
    ("sharded-owed-answers-not-read", "envs/sharded.py",
     "                while shard.owed:", "                while False:", (SHARDED,), "env"),
    ("sharded-unpicklable-answer-kills-the-worker", "envs/sharded.py",
     "        except Exception as error:  # the answer does not pickle (an info, apply's result): say so instead\n"
     '            conn.send(("error", _portable(error)))',
     "        except Exception:  # the answer does not pickle (an info, apply's result): say so instead\n"
     "            raise", (SHARDED,), "env"),
    ("sharded-close-skips-workers-when-a-sub-env-fails", "envs/sharded.py",
     "        try:\n            self.local.close()\n        finally:\n            self._finalizer()",
     "        self.local.close()\n        self._finalizer()", (SHARDED,), "env"),
    ("sharded-half-built-leaks-workers", "envs/sharded.py",
     "        except BaseException:  # a half-built env ends what it started\n            self._finalizer()\n",
     "        except BaseException:  # a half-built env ends what it started\n", (SHARDED,), "env"),
    ("sharded-worker-dies-on-ctrl-c", "envs/sharded.py",
     "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n", "", (SHARDED,), "env"),
]
