"""Mutations of the routing agent's path: the ``route`` action mode (masks, flattening, the action it passes on),
the run as a router, what the mode is refused with, and the runner's refusal of a policy deciding the wrong thing."""

AGENT = "tests/test_route_agent.py"
W = "rl/wrappers.py"

MUTATIONS = [
    ("route-masks-keep-non-fitting", W, "[:, column] > 0", "[:, column] >= 0", (AGENT, "-k", "by_hand"), "rl"),
    ("route-masks-none-when-none-fits", W, "return fits if fits.any() else np.ones(num_replicas, dtype=bool)",
     "return fits", (AGENT, "-k", "by_hand"), "rl"),
    ("route-masks-wrong-column", W, 'column = REPLICA_FEATURES.index("fits")',
     'column = REPLICA_FEATURES.index("free_blocks")', (AGENT, "-k", "by_hand"), "rl"),
    ("route-wrapper-passes-array-action", W, "            action = np.int64(chosen.reshape(-1)[0])\n",
     "            pass\n", (AGENT, "-k", "flat_obs"), "rl"),
    ("route-agent-returns-python-int", "rl/agent.py", "return np.int64(np.asarray(action).reshape(-1)[0])",
     "return int(np.asarray(action).reshape(-1)[0])", (AGENT, "-k", "router_on_the_routing_env"), "rl"),
    ("route-normalises-observations", "rl/route_policy.py", 'return not (mode == "route" and algo in '
     "ROUTE_NETWORK_ALGOS)", "return True", (AGENT, "-k", "trains_in_the_route_mode"), "rl"),
    ("route-mode-allowed-on-admission", "rl/config.py", "        elif mode == ROUTE_MODE:\n",
     "        elif False:\n", (AGENT, "-k", "refused_on_admission"), "rl"),
    ("runner-runs-the-wrong-decision", "servegym/runner.py", "if policy is not None and policy.decision != decision:",
     "if False:", ("tests/test_routers.py", "-k", "wrong_thing"), "rl"),
]
