"""The ``score`` action mode, the parametric scorer that shares its rule, and the network shared across queue
slots (issue 27)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servegym.envs import ENGINE_INDEX, QUEUE_INDEX, TEST_SEEDS
from servegym.policies import make_policy
from servegym.policies.common import admit_by_score
from servegym.rl.wrappers import SCORE_TARGETS, ScoreAdmit, score_action
from servegym.runner import make_env, run_episode
from tests.conftest import fixed, flat_profile


def _target_action(fraction: float) -> float:
    """The action value in [-1, 1] that sets the memory target to ``fraction`` of the cache."""
    low, high = SCORE_TARGETS
    return 2.0 * (fraction - low) / (high - low) - 1.0


def _three_waiting():
    # Prompts 100, 10, 50 tokens, 10 output tokens each, known lengths; 10 blocks of 16 = 160 tokens.
    env = make_env(workload=fixed(np.zeros(3), [100, 10, 50], [10, 10, 10]), profile=flat_profile(),
                   engine={"length_mode": "known", "num_kv_blocks": 10, "block_size": 16})
    obs, _ = env.reset(seed=0)
    return env, obs


def test_the_queue_is_admitted_highest_score_first_within_the_memory_target():
    env, obs = _three_waiting()
    width = obs["queue"].shape[0] // 6
    scores = np.zeros(width)
    scores[:3] = [0.1, 0.9, 0.5]  # order: slot 1 (10 tokens), slot 2 (50), slot 0 (100)
    # All finish together after 10 tokens, so a set's peak is the sum of prompt + 10, plus 15 tokens of block
    # slack each: slot 1 alone 35, with slot 2 110, with slot 0 too 235. At target 1.0 (160 tokens) two fit; at
    # 0.5 (80) one. FCFS would start with the 100-token prompt (slot 0), then slot 1.
    full = score_action(obs, np.append(scores, _target_action(1.0)))
    assert full[:3].tolist() == [0, 1, 2]
    half = score_action(obs, np.append(scores, _target_action(0.5)))
    assert half[:3].tolist() == [0, 1, 0]
    assert np.flatnonzero(make_policy("fcfs").act(obs)).tolist() == [0, 1]
    # Ties keep queue order (slot 0 then 1: 125 + 35 = 160 tokens, just fits; slot 2 would not); scores past the
    # visible queue are ignored.
    tied = admit_by_score(obs, np.r_[0.0, 0.0, 0.0, np.full(width - 3, 9.0)], 1.0)
    assert tied[:3].tolist() == [1, 2, 0]
    env.close()


def test_bad_score_actions_are_clear_errors():
    env, obs = _three_waiting()
    width = obs["queue"].shape[0] // 6
    with pytest.raises(ValueError, match=f"has {width + 1} values"):
        score_action(obs, np.zeros(width))
    with pytest.raises(ValueError, match="finite"):
        score_action(obs, np.r_[np.nan, np.zeros(width)])
    with pytest.raises(ValueError, match="3 visible waiting"):
        admit_by_score(obs, np.zeros(2), 1.0)
    wrapped = ScoreAdmit(env)
    assert wrapped.action_space.shape == (width + 1,)
    env.close()


def test_the_scorer_with_mc_sfs_settings_is_mc_sf():
    # Score -(prompt + 1 x output), no ageing, a fixed target: MC-SF ordered by total length, the same target.
    # The whole episode must match to the bit (same order, same ties, same feasibility rule).
    seed = TEST_SEEDS[0]
    returns = []
    for name, params in (("mc-sf", {"order": "total", "memory_target": 0.85}),
                         ("scorer", {"output_weight": 1.0, "target_base": 0.85})):
        policy = make_policy(name, **params)
        env = make_env(policy, task="memory-tight", split="test", apply_overrides=False)
        returns.append(run_episode(env, policy, seed).total_reward)
    assert returns[0] == returns[1]
    # Ageing changes the order, so the episode: the parameters reach the decisions.
    aged = make_policy("scorer", output_weight=1.0, target_base=0.85, wait_weight=200.0)
    env = make_env(aged, task="memory-tight", split="test", apply_overrides=False)
    assert run_episode(env, aged, seed).total_reward != returns[0]


def test_ageing_puts_a_request_that_waited_first():
    # A (100-token prompt) arrives at 0 s, B (60 tokens) at 5 s; nothing is admitted until B is there. Score
    # -prompt + wait_weight x wait: without ageing B (-60) beats A (-100); with 20 tokens/s, A has waited 5 s
    # longer, so it leads by 5 x 20 - 40 = 60 tokens and goes first.
    env = make_env(workload=fixed([0.0, 5.0], [100, 60], [10, 10]), profile=flat_profile(),
                   engine={"length_mode": "known"})
    obs, _ = env.reset(seed=0)
    with pytest.warns(RuntimeWarning, match="the policy is not admitting"):  # on purpose, for 5 s
        while obs["engine"][ENGINE_INDEX["num_waiting"]] < 2:
            obs, *_ = env.step(np.zeros(obs["queue"].shape[0] // len(QUEUE_INDEX), dtype=np.int64))
    plain = make_policy("scorer", output_weight=0.0)
    aged = make_policy("scorer", output_weight=0.0, wait_weight=20.0)
    assert plain.act(obs)[:2].tolist() == [2, 1]
    assert aged.act(obs)[:2].tolist() == [1, 2]
    waited = obs["queue"].reshape(-1, len(QUEUE_INDEX))[:2, QUEUE_INDEX["wait_s"]]  # A's and B's
    assert waited[0] - waited[1] == pytest.approx(5.0, abs=0.05)
    assert np.diff(aged.scores(obs))[0] == pytest.approx(-(20.0 * (waited[0] - waited[1]) - 40.0), rel=1e-6)
    env.close()


@pytest.mark.parametrize("bad", [{"target_slope": 1.5}, {"wait_weight": -1.0}, {"target_base": 0.0},
                                 {"output_weight": float("nan")}])
def test_bad_scorer_parameters_are_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_policy("scorer", **bad)


def test_the_memory_target_moves_with_the_queue_by_tanh():
    env, obs = _three_waiting()
    policy = make_policy("scorer", target_base=0.8, target_slope=-0.4)
    # Three waiting: 0.8 - 0.4 tanh(3 / 32).
    assert policy.memory_target(obs) == pytest.approx(0.8 - 0.4 * np.tanh(3 / 32))
    env.close()


def test_the_random_score_floor_is_seeded():
    policy = make_policy("random:score")
    env = make_env(policy, task="memory-tight", split="test", apply_overrides=False)
    first = run_episode(env, policy, TEST_SEEDS[0]).total_reward
    assert run_episode(env, policy, TEST_SEEDS[0]).total_reward == first


def test_the_score_network_is_shared_across_queue_slots():
    torch = pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO

    from servegym.envs import ENGINE_INDEX, QUEUE_FEATURES
    from servegym.rl.fast_dist import policy_for
    from servegym.rl.train import make_training_env

    env = make_training_env({"task": "memory-tight", "decision_steps": True}, "score", None, (0, 1))
    model = PPO(policy_for("ppo", env.action_space, "score"), env, seed=0, n_steps=64, batch_size=64)
    obs, _ = env.reset()
    while obs["engine"][ENGINE_INDEX["num_waiting"]] < 4:  # the lowest memory target until four requests wait
        obs, *_ = env.step(np.full(env.action_space.shape, -1.0, dtype=np.float32))
    k, width = 4, obs["queue"].shape[0] // len(QUEUE_FEATURES)
    perm = np.array([2, 0, 3, 1])
    moved = {key: value.copy() for key, value in obs.items()}
    rows = moved["queue"].reshape(width, len(QUEUE_FEATURES))
    rows[:k] = obs["queue"].reshape(width, len(QUEUE_FEATURES))[perm]

    def mean(o):
        tensor, _ = model.policy.obs_to_tensor(o)
        with torch.no_grad():
            return model.policy.get_distribution(tensor).distribution.mean.numpy()[0]

    # Make the head's outputs large enough to compare: the freshly initialised scores are tiny.
    with torch.no_grad():
        model.policy.action_net.score.weight.mul_(100.0)
    before, after = mean(obs), mean(moved)
    assert np.ptp(before[:k]) > 1e-3
    np.testing.assert_allclose(after[:k], before[:k][perm], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(after[width], before[width], rtol=1e-4, atol=1e-6)  # the target: a pooled view
    # A request's score depends on the state, not only on its own row: emptier KV moves every slot's score.
    freer = {key: value.copy() for key, value in obs.items()}
    freer["engine"][ENGINE_INDEX["kv_free_frac"]] = 1.0 - obs["engine"][ENGINE_INDEX["kv_free_frac"]] / 2
    assert np.abs(mean(freer)[:k] - before[:k]).min() > 1e-6


def test_the_scorers_decisions_are_score_actions_exactly():
    # Behaviour cloning needs the expert's decisions in the agent's action space: mapped scores (order kept) and
    # the target mapped back through SCORE_TARGETS admit exactly what the scorer admits, step after step.
    from servegym.rl.wrappers import scorer_action

    scorer = make_policy("scorer", output_weight=3.8, wait_weight=5.2, target_base=0.58, target_slope=0.24)
    env = make_env(scorer, task="memory-tight")
    obs, _ = env.reset(seed=5)
    steps, differ, done = 0, 0, False
    while not done:
        action = scorer.act(obs)
        differ += not np.array_equal(action, score_action(obs, scorer_action(scorer, obs)))
        obs, _, terminated, truncated, _ = env.step(action)
        steps, done = steps + 1, terminated or truncated
    assert steps > 500 and differ == 0


def test_training_rewards_scale_by_a_fixed_number_and_the_episode_statistics_do_not():
    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig, make_training_env

    kwargs = {"task": "memory-tight", "decision_steps": True}
    plain = make_training_env(kwargs, "score", None, (0, 1))
    scaled = make_training_env(kwargs, "score", None, (0, 1), reward_scale=0.01)
    action = np.zeros(plain.action_space.shape, dtype=np.float32)
    plain.reset(), scaled.reset()
    total, done = 0.0, False
    while not done:
        _, r, terminated, truncated, _ = plain.step(action)
        _, s, _, _, info = scaled.step(action)
        assert s == pytest.approx(0.01 * r, rel=1e-12)
        total, done = total + r, terminated or truncated
    assert info["episode"]["r"] == pytest.approx(total, rel=1e-9)  # Monitor sits below the scaling
    with pytest.raises(ValueError, match="reward_scale must be a finite number > 0"):
        TrainConfig(mode="score", reward_scale=0.0)
    with pytest.raises(ValueError, match="imitate warm-starts PPO or A2C in the score mode"):
        TrainConfig(mode="rank", imitate="best_params.json")


def test_imitation_fits_the_policy_to_the_scorer():
    pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3 import PPO

    from servegym.rl.fast_dist import policy_for
    from servegym.rl.imitation import imitate
    from servegym.rl.train import make_training_env

    torch.manual_seed(0)
    kwargs = {"task": "memory-tight", "decision_steps": True}
    env = make_training_env(kwargs, "score", None, (0, 1))
    model = PPO(policy_for("ppo", env.action_space, "score"), env, seed=0, n_steps=64, batch_size=64)
    fit = imitate(model, kwargs, {"output_weight": 2.0, "target_base": 0.7}, episodes=1, epochs=4)
    assert fit["demonstration_steps"] > 300 and fit["last_loss"] < 0.5 * fit["first_loss"]


def test_learning_curves_draw_every_runs_validation_returns(tmp_path):
    pytest.importorskip("matplotlib")
    from servegym.evaluation.plots import learning_curves

    for seed in (0, 1):
        run = tmp_path / f"agent__s{seed}"
        run.mkdir()
        (run / "eval.csv").write_text("10000,-5500.5\n20000,-5400.0\n")
    path = learning_curves(sorted(tmp_path.glob("agent__s*")), tmp_path / "curves.png", {"scorer": -5235.0})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # trains a tiny agent (about 30 s)
def test_a_cloned_score_agent_trains_records_its_warm_start_and_plays_as_a_policy(tmp_path):
    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig, train
    from servegym.tuning.study import write_params

    params = tmp_path / "scorer" / "best_params.json"
    write_params("scorer", {"output_weight": 2.0, "target_base": 0.7}, params)
    cfg = TrainConfig(algo="ppo", mode="score", task="memory-tight", env={"decision_steps": True}, timesteps=128,
                      n_envs=1, eval_freq=128, eval_episodes=1, normalize=False, reward_scale=0.01,
                      imitate=str(params), imitate_episodes=1,
                      hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1}, out=str(tmp_path / "runs"))
    run = train(cfg, progress=False, subprocess=False)
    state = json.loads((run / "config.json").read_text())
    assert state["status"] == "finished" and state["imitation"]["demonstration_steps"] > 300
    assert state["reward_scale"] == 0.01 and state["imitate"] == str(params)
    agent = make_policy(f"rl:{run}")
    env = make_env(agent, task="memory-tight", split="test", apply_overrides=False)
    result = run_episode(env, agent, TEST_SEEDS[0])
    assert result.summary["num_arrived"] == result.summary["num_finished"] + result.summary["num_unfinished"] + \
        result.summary["num_rejected"]
    with pytest.raises(ValueError, match="it needs a scorer"):
        write_params("mc-sf", {"order": "total"}, params)
        train(TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "again")}), progress=False, subprocess=False)


def test_rewards_relative_to_a_reference_sum_to_the_return_difference(tmp_path):
    # Per step the reward adds back the reference's request-seconds over the same stretch of simulated time, so
    # an agent that acts as the reference does earns zero at every step, and any other earns, summed over the
    # episode, its own latency return minus the reference's (each played alone on the same seed).
    from servegym.rl.reference import ReferenceReward

    seed = TEST_SEEDS[0]
    same = ReferenceReward(make_env(task="memory-tight", split="test", apply_overrides=False), "mc-sf")
    policy = make_policy("mc-sf")
    obs, _ = same.reset(seed=seed)
    steps, worst, done = 0, 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = same.step(policy.act(obs))
        steps, worst, done = steps + 1, max(worst, abs(reward)), terminated or truncated
    assert steps > 500 and worst < 1e-6
    # Cut short at 150 steps, the reference leaves requests unserved; they count until its episode ends, so the
    # same agent still earns zero at every step but the last (which pays the truncation charge).
    short = ReferenceReward(make_env(task="memory-tight", split="test", apply_overrides=False, max_steps=150),
                            "mc-sf")
    obs, _ = short.reset(seed=seed)
    rewards, done = [], False
    while not done:
        obs, reward, terminated, truncated, info = short.step(policy.act(obs))
        rewards.append(reward)
        done = terminated or truncated
    assert truncated and info["num_waiting"] + info["num_running"] > 0
    assert len(rewards) == 150 and max(abs(r) for r in rewards[:-1]) < 1e-6 and rewards[-1] < -1000

    def alone(name: str) -> float:
        p = make_policy(name)
        return run_episode(make_env(p, task="memory-tight", split="test", apply_overrides=False), p, seed).total_reward

    other = ReferenceReward(make_env(task="memory-tight", split="test", apply_overrides=False), "mc-sf")
    fcfs = make_policy("fcfs")
    obs, _ = other.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = other.step(fcfs.act(obs))
        total, done = total + reward, terminated or truncated
    assert total == pytest.approx(alone("fcfs") - alone("mc-sf"), rel=1e-9)
    assert total < -1000  # FCFS is worse than MC-SF here: the relative return says by how much
    with pytest.raises(ValueError, match="single engine"):
        ReferenceReward(make_env(task="serverless-burst"), "fcfs").reset(seed=0)
    with pytest.raises(ValueError, match="unknown parameter"):
        ReferenceReward(make_env(task="memory-tight"), "mc-sf", {"depth": 2})


def test_the_score_head_scores_each_slot_with_one_layer_and_the_target_from_the_context_with_the_other():
    # By hand: 3 slots of embedding width 4. The score layer reads feature 0 plus 1, the target layer feature 1
    # minus 2. Slot i's features are (10 i, -i, 7, 7), the context's (100, 5, 7, 7): scores 1, 11, 21 and the
    # target 3 (reading the context with the score layer would give 101; a slot with the target layer, -2 - i).
    torch = pytest.importorskip("torch")
    from servegym.rl.equivariant import ScoreHead

    head = ScoreHead(4, 3)
    with torch.no_grad():
        head.score.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
        head.score.bias.fill_(1.0)
        head.target.weight.copy_(torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
        head.target.bias.fill_(-2.0)
    rows = [[10.0 * i, -float(i), 7.0, 7.0] for i in range(3)] + [[100.0, 5.0, 7.0, 7.0]]
    latent = torch.tensor(rows).reshape(1, -1).repeat(2, 1)  # two states: the batch dimension kept
    assert torch.equal(head(latent), torch.tensor([[1.0, 11.0, 21.0, 3.0]] * 2))


def test_the_score_networks_tanh_and_linear_compute_torchs_values_and_gradients():
    # Rule: the network's Tanh (forward by NumPy from TANH_LARGE elements) and RowLinear (weight gradient as
    # (x^T g)^T from LARGE rows) are nn.Tanh and nn.Linear: below the threshold exactly torch's (an agent acting on
    # one observation computes as before), from it NumPy's tanh bit for bit (within 1.2e-7 of torch.tanh), gradients
    # by gradcheck in float64, and a RowLinear's output and gradients those of nn.Linear with the same parameters
    # (float32 summation order: 1e-4 relative). Catches a wrong backward, a dropped bias, a threshold turned around.
    torch = pytest.importorskip("torch")
    from servegym.rl.equivariant import LARGE, TANH_LARGE, RowLinear, Tanh

    torch.manual_seed(0)
    small, large = torch.randn(TANH_LARGE // 8 - 1, 8) * 3, torch.randn(TANH_LARGE // 8, 8) * 3
    assert torch.equal(Tanh()(small), torch.tanh(small))
    assert torch.equal(Tanh()(large), torch.from_numpy(np.tanh(large.numpy())))
    assert not torch.equal(Tanh()(large), torch.tanh(large))  # the two differ in the last place on some elements
    torch.testing.assert_close(Tanh()(large), torch.tanh(large), rtol=0, atol=1.2e-7)
    x64 = torch.randn(TANH_LARGE // 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(Tanh(), (x64,), fast_mode=True)  # fast: random projections, not 16,384^2
    strided = torch.randn(TANH_LARGE, 2)[:, ::2]
    assert torch.equal(Tanh()(strided), Tanh()(strided.contiguous()))  # a strided input read as its values
    row, plain = RowLinear(6, 5), torch.nn.Linear(6, 5)
    plain.load_state_dict(row.state_dict())
    for rows in (LARGE - 1, LARGE):
        x, weights = torch.randn(rows, 1, 6), torch.randn(rows, 1, 5)  # any leading shape, as nn.Linear takes
        outputs = []
        for layer in (row, plain):
            layer.zero_grad()
            out = layer(x)
            (out * weights).sum().backward()
            outputs.append((out, layer.weight.grad.clone(), layer.bias.grad.clone()))
        for a, b in zip(*outputs, strict=True):
            if rows < LARGE:
                assert torch.equal(a, b)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # float32 sums of 4,096 products, two orders


def test_the_packed_score_network_computes_what_every_row_computes_with_its_gradients():
    # Rule: packing the existing rows (forward) gives the features and gradients of running the networks on every
    # row and masking after (forward_dense), on states with 0, some and all slots and batch rows filled, so a
    # trained agent plays and trains the same either way (tolerance: float32 summation order, 1e-5 absolute).
    torch = pytest.importorskip("torch")
    import gymnasium as gym

    from servegym import task_id
    from servegym.envs import ENGINE_INDEX
    from servegym.rl.equivariant import QueueEncoder

    space = gym.make(task_id("memory-tight")).observation_space
    torch.manual_seed(0)
    encoder = QueueEncoder(space)
    obs = {k: torch.rand(5, *v.shape) * 50 for k, v in space.items()}
    obs["engine"][:, ENGINE_INDEX["num_waiting"]] = torch.tensor([0.0, 1.0, 7.0, 32.0, 90.0])  # 90: all 32 shown
    obs["engine"][:, ENGINE_INDEX["num_running"]] = torch.tensor([0.0, 128.0, 3.0, 0.0, 64.0])
    packed, dense = encoder(obs), encoder.forward_dense(obs)
    assert packed.shape == dense.shape == (5, 33 * 32)
    torch.testing.assert_close(packed, dense, rtol=0, atol=1e-5)
    weights = torch.randn_like(packed)
    grads = []
    for features in (encoder(obs), encoder.forward_dense(obs)):
        encoder.zero_grad()
        (features * weights).sum().backward()
        grads.append([p.grad.clone() for p in encoder.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # An empty slot's mixed row is the same for every empty slot of a state, and a present slot's differs.
    rows = packed[2, : 32 * 32].reshape(32, 32)
    assert torch.equal(rows[7], rows[31]) and not torch.allclose(rows[0], rows[7])
    assert not QueueEncoder(space, packed=False).packed


def test_an_agent_acting_on_one_observation_computes_with_torchs_own_layers():
    # Rule: the fast Tanh and RowLinear paths are for minibatches; one observation (a full running batch of 128
    # rows, the largest tensor an act() makes: 128 x 32 = 4,096 elements) computes exactly what nn.Tanh and
    # nn.Linear compute, bit for bit, so a trained agent's decisions do not depend on the thresholds. Catches a
    # threshold lowered to where the detour costs more than it saves (at 4,096 an act() was 13% slower).
    torch = pytest.importorskip("torch")
    import copy

    import gymnasium as gym

    from servegym import task_id
    from servegym.rl.equivariant import QueueEncoder, RowLinear, Tanh

    space = gym.make(task_id("memory-tight")).observation_space
    torch.manual_seed(0)
    encoder = QueueEncoder(space, packed=False)
    plain = copy.deepcopy(encoder)
    for module in list(plain.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Tanh):
                setattr(module, name, torch.nn.Tanh())
            elif isinstance(child, RowLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features)
                linear.load_state_dict(child.state_dict())
                setattr(module, name, linear)
    assert not any(isinstance(m, Tanh | RowLinear) for m in plain.modules())
    obs = {k: torch.rand(1, *v.shape) * 50 for k, v in space.items()}
    obs["engine"][:, ENGINE_INDEX["num_waiting"]] = 32.0
    obs["engine"][:, ENGINE_INDEX["num_running"]] = 128.0  # every row of the batch and the queue present
    with torch.no_grad():
        assert torch.equal(encoder(obs), plain(obs))
        assert torch.equal(encoder.forward_dense(obs), plain.forward_dense(obs))


def test_the_scorers_action_maps_each_score_by_symlog_over_symlog_of_the_scale_and_clips_past_it():
    # Prompts 100, 10, 50, outputs 10 (known), nothing waited yet: scores -(prompt + w_out x 10) by hand. The mapped
    # score is sign(s) log1p(|s|) / log1p(1e5), clipped to [-1, 1] (the imitation targets behaviour cloning fits).
    from servegym.rl.wrappers import score_target_value, scorer_action

    _, obs = _three_waiting()
    scorer = make_policy("scorer", output_weight=3.8, wait_weight=5.2, target_base=0.58, target_slope=0.24)
    action = scorer_action(scorer, obs)
    expected = [-np.log1p(138.0) / np.log1p(1e5), -np.log1p(48.0) / np.log1p(1e5), -np.log1p(88.0) / np.log1p(1e5)]
    np.testing.assert_allclose(action[:3], expected, rtol=1e-12)
    assert np.all(action[3:-1] == 0.0)  # empty slots
    assert action[-1] == score_target_value(scorer.memory_target(obs))
    far = make_policy("scorer", output_weight=2e4, wait_weight=5.2, target_base=0.58, target_slope=0.24)
    assert np.all(scorer_action(far, obs)[:3] == -1.0)  # |s| > 1e5: past the scale, clipped
    edge = scorer_action(make_policy("scorer", output_weight=9998.0, wait_weight=5.2, target_base=0.58,
                                     target_slope=0.24), obs)
    assert edge[0] == -1.0  # 100 + 99,980 = 100,080 tokens: just past the scale
    assert edge[1] == pytest.approx(-np.log1p(99_990.0) / np.log1p(1e5), rel=1e-12) and edge[1] > -1.0  # just inside


def test_predicted_lengths_float32_scores_are_mapped_in_float64():
    # With predicted lengths the scorer's scores are float32 (the observation's midpoints): symlog in float32, as
    # NumPy computes it, then the division in float64. A Python float divisor would keep them float32, rounding
    # mapped scores, hence the residual's and the imitation targets' order, differently.
    from servegym.rl.wrappers import _mapped_scores

    env = make_env(workload=fixed(np.zeros(3), [100, 10, 50], [10, 30, 20]), profile=flat_profile(),
                   engine={"length_mode": "predicted", "num_kv_blocks": 10, "block_size": 16})
    obs, _ = env.reset(seed=0)
    scorer = make_policy("scorer", output_weight=3.7, wait_weight=5.2, target_base=0.58, target_slope=0.24)
    raw = scorer.scores(obs)
    assert raw.dtype == np.float32
    mapped = _mapped_scores(scorer, obs)
    assert mapped.dtype == np.float64
    np.testing.assert_array_equal(mapped, (np.sign(raw) * np.log1p(np.abs(raw))).astype(np.float64) / np.log1p(1e5))
