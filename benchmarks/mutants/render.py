"""Mutations of the episode views (issue 31): the frame's KV cells and container states, the trace's phases and
their tiling, and the trace's counters."""

VIEWS = "tests/test_render_trace.py"

MUTATIONS = [
    ("kv-cells-floor-not-ceil", "envs/render.py",
     "    per_cell = max(1, math.ceil(view.num_kv_blocks / cells))",
     "    per_cell = max(1, view.num_kv_blocks // cells)", (VIEWS,), "env"),
    ("kv-prefill-coloured-as-decode", "envs/render.py",
     "    owners = np.repeat(np.where(view.prefilling, 2, 1)", "    owners = np.repeat(np.where(view.prefilling, 1, 2)",
     (VIEWS,), "env"),
    ("lone-engine-shown-cold", "envs/render.py",
     "    if engine.ready_at == math.inf:", "    if math.isinf(engine.ready_at):", (VIEWS,), "env"),
    ("loading-shown-as-idle", "envs/render.py",
     "    elif now < engine.ready_at:", "    elif now > engine.ready_at:", (VIEWS,), "env"),
    ("kv-blocks-floor", "envs/render.py",
     "    return PanelView(state, -(-kv_tokens // engine.block_size)",
     "    return PanelView(state, (kv_tokens // engine.block_size)", (VIEWS,), "env"),
    ("preemption-gap-called-decoding", "evaluation/trace.py",
     '            spans.append(Span(r, "prefill" if k == 0 else "preempted", t, first))',
     '            spans.append(Span(r, "prefill" if k == 0 else "decoding", t, first))', (VIEWS,), "evaluation"),
    ("waiting-ends-at-first-token", "evaluation/trace.py",
     '        spans.append(Span(r, "waiting", arrival, admit))',
     '        spans.append(Span(r, "waiting", arrival, float(log.first_token_s[r])))', (VIEWS,), "evaluation"),
    ("unfinished-stop-at-arrival", "evaluation/trace.py",
     "        stop = float(log.finish_s[r]) if state == State.FINISHED else max(end, arrival)",
     "        stop = float(log.finish_s[r]) if state == State.FINISHED else arrival", (VIEWS,), "evaluation"),
    ("queue-counter-reads-running", "evaluation/trace.py",
     '"args": {"waiting": int(values["num_waiting"])}', '"args": {"waiting": int(values["num_running"])}',
     (VIEWS,), "evaluation"),
]
