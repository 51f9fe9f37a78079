"""Mutations of the score action mode, the parametric scorer and behaviour cloning from it (issue 27)."""

SCORE = "tests/test_score_mode.py"
ZOO = "tests/test_zoo.py"

MUTATIONS = [
    ("score-admits-lowest-first", "policies/common.py",
     "ranked = np.argsort(-scores[: rows.shape[0]], kind=\"stable\")",
     "ranked = np.argsort(scores[: rows.shape[0]], kind=\"stable\")", (SCORE,), "rl"),
    ("score-ignores-the-memory-target", "policies/common.py",
     "upper_remaining_queue(ordered), memory_target))", "upper_remaining_queue(ordered), 1.0))", (SCORE,), "rl"),
    ("score-target-range-upside-down", "rl/wrappers.py",
     "target = low + (float(np.clip(values[width], -1.0, 1.0)) + 1.0) / 2.0 * (high - low)",
     "target = high - (float(np.clip(values[width], -1.0, 1.0)) + 1.0) / 2.0 * (high - low)", (SCORE,), "rl"),
    ("scorer-ageing-penalises-waiting", "policies/scorer.py",
     "return (p.wait_weight * rows[:, QUEUE_INDEX[\"wait_s\"]]",
     "return (-p.wait_weight * rows[:, QUEUE_INDEX[\"wait_s\"]]", (SCORE,), "rl"),
    ("scorer-target-slope-ignored", "policies/scorer.py",
     "p.target_base + p.target_slope * math.tanh(", "p.target_base + 0.0 * math.tanh(", (SCORE,), "rl"),
    ("imitation-target-not-mapped-back", "rl/imitation.py",
     "action[width] = score_target_value(expert.memory_target(obs))",
     "action[width] = np.clip(expert.memory_target(obs), -1.0, 1.0)", (SCORE,), "rl"),
    ("reward-scale-applied-to-the-statistics", "rl/train.py",
     "        env = TrainSeeds(env, *seeds)\n    env = Monitor(env) if monitor else env\n",
     "        env = TrainSeeds(env, *seeds)\n"
     "    env = gym.wrappers.TransformReward(env, partial(_scaled, reward_scale))\n"
     "    env = Monitor(env) if monitor else env\n", (SCORE,), "rl"),
    ("reference-reward-counts-from-the-start", "rl/reference.py",
     "reward += seconds - self._seconds", "reward += seconds", (SCORE,), "rl"),
    ("reference-reward-forgets-the-unfinished", "rl/reference.py",
     "finish = np.where(log.state == State.FINISHED, log.finish_s, end)",
     "finish = np.where(log.state == State.FINISHED, log.finish_s, log.arrival_s)", (SCORE,), "rl"),
    ("score-net-slots-see-no-context", "rl/equivariant.py",
     "mixed = self.mix(torch.cat([slots, context[:, None, :].expand(-1, self.width, -1)], dim=2))",
     "mixed = self.mix(torch.cat([slots, 0 * context[:, None, :].expand(-1, self.width, -1)], dim=2))",
     (SCORE,), "rl"),
    ("zoo-timesteps-ignored", "rl/zoo.py",
     'fields["timesteps"] = int(float(entry.pop("n_timesteps")))', 'entry.pop("n_timesteps")', (ZOO,), "rl"),
    ("zoo-policy-kwargs-left-a-string", "rl/zoo.py",
     'entry["policy_kwargs"] = policy_kwargs(entry["policy_kwargs"])',
     'entry["policy_kwargs"] = entry["policy_kwargs"]', (ZOO,), "rl"),
]
