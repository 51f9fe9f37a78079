"""Mutations of TWP in a pool (one controller per container unless ``shared_controller``) and of ``B0`` taken from
the env's profile unless given (``tests/test_twp_containers.py``)."""

T = "tests/test_twp_containers.py"
OWN = T + "::test_each_container_has_its_own_controller"
B0 = T + "::test_b0_comes_from_the_profile_and_an_explicit_value_wins"
B0_RUN = T + "::test_b0_from_the_profile_reaches_the_window_floor_in_a_run"

MUTATIONS = [
    ("twp-controllers-shared-despite-default", "policies/twp.py",
     "self._load_controller(0 if p.shared_controller else container)", "self._load_controller(0)", (OWN,), "twp"),
    ("twp-shared-by-default", "policies/twp.py",
     "    shared_controller: bool = param(\n        False,", "    shared_controller: bool = param(\n        True,",
     (OWN,), "twp"),
    ("twp-switch-forgets-the-controller", "policies/twp.py",
     "        self._controllers[self._container] = self._controller_state()\n", "", (OWN,), "twp"),
    ("twp-b0-ignores-the-profile", "policies/twp.py",
     "return self.profile_b0 or DEFAULT_B0", "return DEFAULT_B0", (B0, B0_RUN), "twp"),
    ("twp-explicit-b0-loses-to-the-profile", "policies/twp.py",
     'if b0 != "profile":', 'if b0 != "profile" and self.profile_b0 is None:', (B0,), "twp"),
    ("twp-make-env-binds-no-profile", "servegym/runner.py",
     "policy.bind_profile(env_profile(env))", "policy.bind_profile(None)", (B0, B0_RUN), "twp"),
]
MUTATIONS.append(
    ("grid-series-mixes-containers", "evaluation/grid.py", '        if "container" in diagnostics:',
     '        if False:', ("tests/test_twp_containers.py::test_the_grid_plots_container_zeros_controller_beside_"
                          "container_zeros_log",), "twp containers"))
