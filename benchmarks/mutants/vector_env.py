"""Mutations of the native vector env, its SB3 adapter and the packed score network (issue 53): autoreset, seeds,
same-step finals, terminal observations, the packed mean and the empty slots' shared row."""

VECTOR = "tests/test_vector_env.py"
SCORE = "tests/test_score_mode.py::test_the_packed_score_network_computes_what_every_row_computes_with_its_gradients"

MUTATIONS = [
    ("vector-next-step-autoreset-ignored", "envs/vector.py",
     "            if self._autoreset[i]:  # NextStep", "            if False:  # NextStep", (VECTOR,), "env"),
    ("vector-seeds-all-the-same", "envs/vector.py",
     "        return [int(seed) + i for i in range(n)]", "        return [int(seed) for i in range(n)]", (VECTOR,),
     "env"),
    ("vector-same-step-final-info-dropped", "envs/vector.py",
     '                info = {**info, "final_obs": final_obs, "final_info": final_info}',
     '                info = {**info, "final_obs": final_obs}', (VECTOR,), "env"),
    ("vector-info-typed-float", "envs/vector.py",
     "        return np.zeros(n, dtype=type(first))", "        return np.zeros(n, dtype=np.float64)", (VECTOR,), "env"),
    ("vector-reset-env-keeps-flags", "envs/vector.py",
     "        self._terminations[i] = self._truncations[i] = self._autoreset[i] = self._ended[i] = False\n",
     "", (VECTOR,), "env"),
    ("sb3-vec-terminal-observation-is-the-reset-one", "rl/vec_env.py",
     '                info = {**info["final_info"], "terminal_observation": info["final_obs"]}',
     '                info = {**info["final_info"], "terminal_observation": obs[i]}', (VECTOR,), "rl"),
    ("sb3-vec-rewards-float64", "rl/vec_env.py",
     "rewards.astype(np.float32)", "rewards.copy()", (VECTOR,), "rl"),
    ("packed-mean-divides-by-zero", "rl/equivariant.py",
     "    return sums / mask.sum(dim=1, keepdim=True).clamp(min=1).to(rows.dtype)",
     "    return sums / mask.sum(dim=1, keepdim=True).to(rows.dtype)", (SCORE,), "rl"),
    ("packed-empty-slot-row-from-ones", "rl/equivariant.py",
     "        empty = self.mix(torch.cat([context.new_zeros(n, self.embed), context], dim=1))",
     "        empty = self.mix(torch.cat([context.new_ones(n, self.embed), context], dim=1))", (SCORE,), "rl"),
    ("packed-running-pool-uses-queue-mask", "rl/equivariant.py",
     "        pooled = _packed_mean(self.run(symlog(batch[running])), running)",
     "        pooled = _packed_mean(self.run(symlog(batch[present[:, :1].expand(-1, self.batch)])), "
     "present[:, :1].expand(-1, self.batch))", (SCORE,), "rl"),
    ("vector-disabled-steps-an-ended-episode", "envs/vector.py",
     "                    self._ended[i] = True\n", "                    pass\n", (VECTOR,), "env"),
    ("vector-reset-mask-ignored", "envs/vector.py", "            if mask[i]:\n", "            if True:\n", (VECTOR,),
     "env"),
    ("vector-shared-instance-accepted", "envs/vector.py",
     "        if len({id(env.unwrapped) for env in self.envs}) != self.num_envs:",
     "        if False:", (VECTOR,), "env"),
]
