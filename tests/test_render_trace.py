"""Seeing an episode: rgb_array frames (and RecordVideo over them), the Trace Event Format export whose spans
tile every request's life, and the timeline figure."""

from __future__ import annotations

import itertools
import json

import gymnasium as gym
import numpy as np
import pytest

import servegym
from servegym.engine import STEP_INDEX
from servegym.envs.render import PanelView, draw_frame, frame_shape, kv_cells, panel_of
from servegym.evaluation.trace import episode_end, request_spans, trace_events
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
from tests.conftest import admit_all, fixed, make

# ------------------------------------------------------------------------------------------- frames


def view(**changes) -> PanelView:
    fields = dict(state="running", kv_blocks=np.array([3, 2]), prefilling=np.array([False, True]),
                  num_kv_blocks=10, queue_prompt=np.array([100, 2000]), queue_predicted=np.array([50, 500]),
                  decode_tokens=1, prefill_tokens=64, token_budget=128)
    return PanelView(**{**fields, **changes})


def test_kv_cells_colour_each_requests_blocks_by_its_state_in_activation_order():
    # 3 decoding blocks, then 2 prefilling, then 5 free; one block a cell.
    cells, per_cell = kv_cells(view(), cells=10)
    assert per_cell == 1 and cells.tolist() == [1, 1, 1, 2, 2, 0, 0, 0, 0, 0]
    # 4 cells for 10 blocks: ceil(10 / 4) = 3 blocks a cell, each showing its first block (0, 3, 6, 9).
    cells, per_cell = kv_cells(view(), cells=4)
    assert per_cell == 3 and cells.tolist() == [1, 2, 0, 0]


def test_a_frame_has_the_declared_shape_and_shows_what_changed():
    frame = draw_frame(1.5, 7, [view()])
    assert frame.shape == frame_shape(1) == (148, 640, 3) and frame.dtype == np.uint8
    for changed in (view(kv_blocks=np.array([6, 2])), view(state="cold"), view(prefill_tokens=0),
                    view(queue_prompt=np.array([100]), queue_predicted=np.array([50]))):
        assert (draw_frame(1.5, 7, [changed]) != frame).any()
    assert (draw_frame(2.5, 7, [view()]) != frame).any()  # the clock


def test_rgb_array_frames_follow_the_episode():
    env = gym.make(servegym.ENV_ID, workload="burst", render_mode="rgb_array")
    env.reset(seed=0)
    first = env.render()
    assert first.shape == frame_shape(1) and first.dtype == np.uint8
    frames = [first]
    for _ in range(30):
        env.step(admit_all(env))
        frames.append(env.render())
    assert all(f.shape == first.shape for f in frames)
    assert len({f.tobytes() for f in frames}) > 20  # the clock alone changes every frame
    env.close()


def test_a_panel_holds_the_engines_own_counts():
    # Each running request holds ceil(KV tokens / block size) blocks: their sum is the engine's count at every
    # step, and the requests drawn as prefilling are the engine's prefilling ones.
    env = gym.make(servegym.ENV_ID, workload="burst")
    env.reset(seed=0)
    engine = env.unwrapped.engine
    for _ in range(60):
        env.step(admit_all(env))
        panel = panel_of(engine, env.unwrapped.cluster.log, env.unwrapped.queue_window, env.unwrapped.cluster.time)
        assert panel.state == ("running" if engine.num_running else "idle")  # a lone engine is never cold
        assert int(panel.kv_blocks.sum()) == engine.num_used_blocks
        assert int(panel.prefilling.sum()) == engine.num_prefilling
        assert panel.queue_prompt.size == min(engine.waiting.size, env.unwrapped.queue_window)
    assert engine.num_used_blocks > 0
    env.close()


def test_a_pool_draws_one_panel_per_container_in_its_state():
    # serverless-burst: 4 containers starting cold; the first arrival starts container 0's load (13 s), so at
    # reset it is loading and the others cold. The arrivals during the load are routed one at a time to the
    # least loaded container, warm or not, so they spread over all four and start the other three loading; when
    # container 0's load completes it is idle until the step admits, then it runs while the others still load.
    env = gym.make(servegym.task_id("serverless-burst"), render_mode="rgb_array")
    env.reset(seed=0)
    unwrapped = env.unwrapped
    n = unwrapped.pool_config.num_containers

    def states() -> list[str]:
        now = unwrapped.cluster.time
        return [panel_of(e, unwrapped.cluster.log, unwrapped.queue_window, now).state
                for e in unwrapped.cluster.engines]

    assert n == 4 and env.render().shape == frame_shape(n)
    seen = [states()]
    for _ in range(2):
        env.step(admit_all(env))
        seen.append(states())
    assert seen == [["loading", "cold", "cold", "cold"], ["idle", "loading", "loading", "loading"],
                    ["running", "loading", "loading", "loading"]]
    env.close()


def test_record_video_writes_an_episode_of_a_task(tmp_path):
    pytest.importorskip("moviepy")
    from gymnasium.wrappers import RecordVideo

    env = RecordVideo(gym.make(servegym.task_id("relaxed"), render_mode="rgb_array", max_episode_steps=40),
                      str(tmp_path), episode_trigger=lambda episode: True, disable_logger=True)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(admit_all(env))
        done = terminated or truncated
    env.close()
    videos = list(tmp_path.glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000


# ------------------------------------------------------------------------------------------- trace


def test_spans_by_hand_through_a_preemption():
    # Discrete time (1 s a step), 16 one-token blocks, two 4-token prompts wanting 6 tokens each (the case of
    # test_engine's restart test, keep_output). Both are admitted at 0 and emit their first token at the end of
    # step 1 (t = 1). B is evicted at step 5 after tokens at 1..4, returns when A finishes at 6, re-ingests and
    # emits tokens 5 and 6 at t = 7 and 8.
    env = make(fixed([0.0, 0.0], [4, 4], [6, 6]), profile="discrete-time",
               engine={"num_kv_blocks": 16, "block_size": 1, "preemption": "lifo", "recompute": "keep_output",
                       "max_num_seqs": 8, "max_num_batched_tokens": 64, "prefill_chunk_tokens": 64})
    env.reset(seed=0)
    terminated = False
    while not terminated:
        _, _, terminated, _, _ = env.step(admit_all(env))
    spans, rejected = request_spans(env.unwrapped.engine.log)
    env.close()
    assert rejected == []
    assert [(s.request, s.phase, s.start_s, s.end_s) for s in spans] == [
        (0, "waiting", 0.0, 0.0), (0, "prefill", 0.0, 1.0), (0, "decoding", 1.0, 6.0),
        (1, "waiting", 0.0, 0.0), (1, "prefill", 0.0, 1.0), (1, "decoding", 1.0, 4.0),
        (1, "preempted", 4.0, 7.0), (1, "decoding", 7.0, 8.0)]


def assert_spans_tile_every_life(log, end):
    spans, rejected = request_spans(log, end)
    by_request: dict[int, list] = {}
    for s in spans:
        by_request.setdefault(s.request, []).append(s)
    arrived = {r for r in range(log.num_requests) if log.arrival_s[r] <= end and log.state[r] != 0}
    assert set(by_request) | set(rejected) == arrived and not set(by_request) & set(rejected)
    for r, parts in by_request.items():
        assert parts[0].start_s == log.arrival_s[r]
        for a, b in itertools.pairwise(parts):
            assert a.end_s == b.start_s and a.end_s >= a.start_s
        finished = not np.isnan(log.finish_s[r])
        assert parts[-1].end_s == (log.finish_s[r] if finished else max(end, log.arrival_s[r]))
    return spans


def test_a_burst_trace_is_valid_trace_event_json_and_accounts_for_every_request():
    policy = make_policy("fcfs")
    env = make_env(policy, workload="burst", max_episode_steps=3000)
    result = run_episode(env, policy, seed=0)
    log = result.log
    spans = assert_spans_tile_every_life(log, episode_end(log))
    data = json.loads(json.dumps(trace_events(log)))
    events = data["traceEvents"]
    assert {"ph", "name", "pid"} <= set(events[0]) and data["displayTimeUnit"] == "ms"
    complete = [e for e in events if e["ph"] == "X"]
    assert all({"ts", "dur", "tid", "cat"} <= set(e) and e["dur"] >= 0 for e in complete)
    assert len([e for e in complete if e["cat"] == "request"]) == len(spans)
    assert len([e for e in complete if e["cat"] == "container"]) == len(log.steps())
    assert {e["name"] for e in events if e["ph"] == "C"} == {"KV blocks used, container 0",
                                                             "queue length, container 0"}
    steps = log.steps(0)
    queue = [e["args"]["waiting"] for e in events if e["name"] == "queue length, container 0"]
    used = [e["args"]["used"] for e in events if e["name"] == "KV blocks used, container 0"]
    assert queue == steps[:, STEP_INDEX["num_waiting"]].astype(int).tolist()
    assert used == steps[:, STEP_INDEX["num_used_blocks"]].astype(int).tolist()
    traced = {e["tid"] for e in events if e.get("cat") == "request"}
    counts = log.counts()
    assert len(traced) == counts["num_arrived"]  # every arrived request has a track (rejected: an instant)
    env.close()


def test_a_truncated_episode_ends_its_spans_at_the_last_step():
    policy = make_policy("fcfs")
    env = make_env(policy, workload="burst", max_episode_steps=60)
    log = run_episode(env, policy, seed=1).log
    end = episode_end(log)
    spans = assert_spans_tile_every_life(log, end)
    assert any(np.isnan(log.finish_s[s.request]) for s in spans)  # some were still waiting or running
    env.close()


# ------------------------------------------------------------------------------------------- timeline


def test_run_writes_the_timeline_and_the_trace(tmp_path, capsys):
    from servegym.cli import main

    trace = tmp_path / "trace.json"
    assert main(["run", "--workload", "burst", "--policy", "fcfs", "--out", str(tmp_path / "run"), "--trace",
                 str(trace), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "timeline.png" in out and "Trace Event Format" in out
    png = (tmp_path / "run" / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert json.loads(trace.read_text())["otherData"]["source"] == "servegym"


def test_run_refuses_an_unwritable_trace_before_the_episode(tmp_path, capsys):
    from servegym.cli import main

    (tmp_path / "file").write_text("")
    assert main(["run", "--workload", "burst", "--trace", str(tmp_path / "file" / "t.json")]) == 2
    assert "not writable" in capsys.readouterr().err


def test_run_out_without_matplotlib_still_writes_the_csvs(tmp_path, capsys, monkeypatch):
    import sys

    from servegym.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it now raises ImportError
    assert main(["run", "--workload", "burst", "--out", str(tmp_path), "--quiet", "--max-steps", "50"]) == 0
    assert "no timeline.png: matplotlib is missing" in capsys.readouterr().out
    assert (tmp_path / "requests.csv").is_file() and not (tmp_path / "timeline.png").exists()
