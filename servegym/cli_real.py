"""``servegym calibrate`` and ``servegym fidelity``: fit a profile to the real backend, then check it.

Every argument is checked, and the sweep is checked against the KV cache, before the model is built (the
3B preset takes minutes to build).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from servegym.backends import load_profile
from servegym.backends.calibration import calibrate, plot_fit, write_samples_csv
from servegym.backends.calibration_provenance import CLOCKS, clock_option, point_spreads, spread_warning
from servegym.backends.calibration_sweep import (
    CPU_MAX_BATCH,
    CPU_MAX_CONTEXT,
    CUDA_MAX_BATCH,
    CUDA_MAX_CONTEXT,
    SweepPlan,
)
from servegym.backends.speed_probe import KINDS, describe_plan, drift, drift_advice, kind_medians, probe_plan
from servegym.cli_args import non_negative_int, positive_int, writable_dir
from servegym.engine import EngineConfig
from servegym.workloads import WORKLOADS, make_workload

DEFAULT_KV_BLOCKS = 8192
"""Calibration's cache when --kv-blocks is not given, unless the sweep needs more."""
DTYPES = ("float32", "bfloat16", "float16")


def resolve_device(text: str | None) -> str:
    """``text`` checked by the backend's own rules (cpu, cuda or cuda:N, and that device present), or the
    default: cuda when available."""
    from servegym.backends.torch_backend import resolve_device as check
    from servegym.backends.torch_model import MissingExtraError, require_torch

    try:
        torch, _ = require_torch()
    except MissingExtraError as err:
        raise ValueError(str(err)) from None
    if text is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        check(torch, text)
    except ValueError as err:
        raise ValueError(f"--{err}") from None
    return text


def _threads(count: int) -> str:
    return f"{count} thread{'s' * (count != 1)}"


def _backend_options(args: argparse.Namespace, device: str, threads: int | None) -> dict[str, Any]:
    options: dict[str, Any] = {"model": args.model, "device": device}
    if args.dtype:
        options["dtype"] = args.dtype
    if threads:
        options["threads"] = threads
    return options


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.backend != "torch":
        raise ValueError("only the torch backend can be calibrated (the calibrated one is the fit)")
    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    max_batch = args.max_batch or (CUDA_MAX_BATCH if cuda else CPU_MAX_BATCH)
    max_context = args.max_context or (CUDA_MAX_CONTEXT if cuda else CPU_MAX_CONTEXT)
    if max_context < args.block_size:
        raise ValueError(f"--max-context {max_context} is shorter than one KV block (--block-size {args.block_size})")
    plan = SweepPlan.up_to(max_batch, max_context, args.repeats, max(max_context, args.max_tokens))
    options = {**clock_option(args.clock), **_backend_options(args, device, args.threads),
               "max_batch_tokens": plan.max_step_tokens()}  # CUDA memory is profiled for the largest step
    if args.kv_blocks:
        kv_blocks = args.kv_blocks
    elif cuda:
        kv_blocks = None  # as many as fit in device memory: the profile's KV capacity is the GPU's
    else:
        kv_blocks = max(DEFAULT_KV_BLOCKS, plan.kv_blocks_needed(args.block_size))
    if kv_blocks is not None:
        plan.check_fits(kv_blocks, args.block_size)
    out = Path(args.out)
    plot = Path(args.plot) if args.plot else out.with_suffix(".png")
    for folder in {out.parent, plot.parent}:
        writable_dir(folder)

    import torch

    from servegym.backends.torch_backend import TorchBackend

    start = time.perf_counter()
    backend = TorchBackend(num_kv_blocks=kv_blocks, block_size=args.block_size, **options)
    build = time.perf_counter() - start
    print(f"servegym calibrate: {backend.model_name} on {backend.device} ({backend.dtype}), "
          f"{_threads(torch.get_num_threads())}, built in {build:.1f} s; decode batches up to {max(plan.batches)} at "
          f"contexts {list(plan.contexts)}, prefill chunks up to {max(plan.chunks)}, {plan.repeats} repeats; "
          f"{backend.num_kv_blocks} KV blocks of {args.block_size} tokens", flush=True)
    # A checkpoint's load is a cold start; a preset's random initialisation is not (None).
    profile, samples = calibrate(backend, args.name or out.stem, plan, load_seconds=backend.cold_start_s,
                                 build_seconds=build,
                                 progress=None if args.quiet else lambda text: print(f"  {text}", flush=True))
    profile.save(out)
    plot_fit(profile, samples, plot)
    table = out.with_suffix(".samples.csv")
    write_samples_csv(samples, table)

    prov, terms = profile.provenance, profile.provenance["terms"]
    print(f"runtime {profile.runtime} ({prov['clock']} clock): " + ", ".join(
        f"{term} {t['value']:.3g} +- {t['standard_error']:.2g}" for term, t in terms.items()))
    for group, err in prov["fit_error"].items():
        held = prov["holdout_error"].get(group)
        held_text = (f"; held out: mean |rel err| {held['mean_abs_rel_error']:.1%}, max "
                     f"{held['max_abs_rel_error']:.1%} ({held['samples']} points)") if held else ""
        print(f"  fit {group}: RMSE {err['rmse_ms']:.2f} ms, mean |rel err| {err['mean_abs_rel_error']:.1%} "
              f"({err['samples']} points){held_text}")
    spread, machine_load = prov["spread"], prov["load"]
    if "median" in spread:
        print(f"  repeat spread (max - min) / median: median {spread['median']:.1%}, max {spread['max']:.1%} over "
              f"{spread['points']} points")
    else:
        print("  repeat spread not measured (--repeats 1)")
    print(f"  load average {machine_load['loadavg_before']} before, {machine_load['loadavg_after']} after, on "
          f"{prov['cpus_usable']} usable CPUs; {machine_load['cpu_per_wall']} CPU s per wall s during the sweep")
    warning = spread_warning(point_spreads(samples))
    if warning:
        print(f"servegym calibrate: warning: {warning}", file=sys.stderr)
    if "capped" in prov["noise"]:
        print(f"servegym calibrate: warning: {prov['noise']['capped']}", file=sys.stderr)
    print(f"wrote {out}, {plot} and {table}")
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from servegym.evaluation.fidelity import (
        FirstRequests,
        fidelity,
        fidelity_table,
        ranking_table,
        speed_check,
        speed_table,
        timing_table,
        verdict,
        write_fidelity_csv,
    )

    profile = load_profile(args.profile)  # fails on a bad path before the model is built
    device = resolve_device(args.device)
    threads = args.threads or profile.provenance.get("threads")
    if args.speed_only:
        speeds = speed_check(args.profile, clock=args.clock, backend_options=_backend_options(args, device, threads))
        print(f"machine speed against {args.profile} (the speed probe's medians of measured / profile, decode-only/"
              f"with prefill, 3 times): {', '.join(map(str, speeds))}")
        for kind, median in kind_medians(speeds).items():
            print(f"  {KINDS[kind]} run {drift(median)} than when the profile was fitted")
        print(drift_advice(speeds))
        return 0
    workload = make_workload(args.workload)
    if args.max_requests:
        workload = FirstRequests(workload, args.max_requests)
    out = writable_dir(Path(args.out)) if args.out else None
    print(f"servegym fidelity: {' '.join(args.policy)} on {args.workload}, seeds {args.seeds}, {args.repeats} real "
          f"repeats each; real backend ({device}, {_threads(threads) if threads else 'default threads'}) vs profile "
          f"{args.profile}", flush=True)
    report = fidelity(args.policy, workload, args.profile, seeds=args.seeds, repeats=args.repeats, clock=args.clock,
                      backend_options=_backend_options(args, device, threads),
                      progress=None if args.quiet else lambda text: print(f"  {text}", flush=True))
    table, orders, steps = fidelity_table(report.rows), ranking_table(report.orders), timing_table(report.timings)
    speeds = speed_table(report.speeds, report.seeds, report.repeats)
    notes = "\n".join(f"- {policy}: {timing.describe()}" for policy, timing in report.timings.items())
    summary = verdict(report)
    print(f"{table}\n\n{orders}\n\n{summary}\n\nmachine speed before each real episode (measured / profile):\n"
          f"{speeds}\n\nstep latency of the real runs:\n{steps}\n{notes}")
    if out:
        write_fidelity_csv(report.rows, out / "fidelity.csv")
        subset = f", first {args.max_requests} requests" if args.max_requests else ""
        (out / "fidelity.md").write_text(
            f"Workload `{args.workload}`{subset}, seeds {list(report.seeds)}, {report.repeats} real repeats per "
            f"seed; real backend `{args.model}` on {device} vs profile `{args.profile}`. Written by `servegym "
            f"fidelity --profile {args.profile} --workload {args.workload} --policy {' '.join(args.policy)} --seeds "
            f"{' '.join(map(str, args.seeds))} --repeats {args.repeats}`.\n\n{summary}.\n\n## Episode metrics\n\n"
            "Means over the seeds (real: each seed's mean over its repeats); per seed: the model's error on each "
            "seed alone; real repeat spread: the median over seeds of (max - min) / mean of a seed's real repeats; "
            "at the measured machine speed: the model's error when each seed's episode runs at the speed the probe "
            "measured before that seed's real repeats (below)."
            f"\n\n{table}\n\n## Machine speed\n\nBefore each real episode the speed probe times calibration sweep "
            f"steps ({describe_plan(probe_plan(profile))}, each within the profile's sweep; the cache's free blocks "
            "shuffled first) and reports the median of measured / profile: 1.000 is the machine as it was when the "
            "profile was fitted."
            f"\n\n{speeds}\n\n## Ranking\n\nEvery pair of policies and metric where the real means differ by more "
            f"than the sum of the two policies' repeat spreads, and whether the model orders them alike.\n\n{orders}"
            f"\n\n## Step latency of the real runs\n\n{steps}\n\n{notes}\n")
        print(f"wrote {out / 'fidelity.csv'} and {out / 'fidelity.md'}")
    return 0


def _model_args(parser: argparse.ArgumentParser, clock_default: str) -> None:
    parser.add_argument("--model", default="small-llama", help="preset (small-llama, tiny-llama, llama-3.2-3b) "
                        "or a local Hugging Face checkpoint folder")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--dtype", default=None, choices=DTYPES, help="default by device")
    parser.add_argument("--clock", default=None, choices=CLOCKS,
                        help="what a real step's time counts: packing + forward + sampling, or the forward pass "
                             f"alone (default: {clock_default})")


def add_real_backend_parsers(sub: Any) -> None:
    """Add ``servegym calibrate`` and ``servegym fidelity`` to ``sub`` (the ``add_subparsers()`` result)."""
    cal = sub.add_parser("calibrate", help="sweep a real model and fit a calibrated profile")
    cal.add_argument("--backend", default="torch", choices=["torch"],
                     help="the backend to sweep: the real one (the calibrated backend is the fit)")
    _model_args(cal, "the backend's")
    cal.add_argument("--threads", type=positive_int, default=None,
                     help="torch CPU threads (default: torch's choice; 1 is steadiest on a shared machine)")
    cal.add_argument("--max-batch", type=positive_int, default=None,
                     help=f"largest decode batch swept (default {CUDA_MAX_BATCH} on CUDA, {CPU_MAX_BATCH} on CPU)")
    cal.add_argument("--max-context", type=positive_int, default=None,
                     help=f"longest decode point's context swept, in tokens (its rows spread from 1/8 to 15/8 of "
                          f"it; prefill chunks also start at half of it; default "
                          f"{CUDA_MAX_CONTEXT} on CUDA, {CPU_MAX_CONTEXT} on CPU)")
    cal.add_argument("--max-tokens", type=positive_int, default=EngineConfig().max_num_batched_tokens,
                     help="largest prefill step swept, single chunks and batched prompts (default: the engine's "
                          "max_num_batched_tokens, %(default)s, so that episodes stay inside the measured range)")
    cal.add_argument("--repeats", type=positive_int, default=3,
                     help="timings per sweep point, the median fitted (default: 3)")
    cal.add_argument("--kv-blocks", type=positive_int, default=None,
                     help="KV cache blocks, the profile's KV capacity (default: on CUDA as many as fit in device "
                          f"memory; on CPU {DEFAULT_KV_BLOCKS}, or what the sweep needs if more)")
    cal.add_argument("--block-size", type=positive_int, default=16)
    cal.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    cal.add_argument("--out", required=True, help="profile JSON to write (the samples CSV goes next to it)")
    cal.add_argument("--plot", default=None, help="PNG of measured vs fitted latency (default: next to --out)")
    cal.add_argument("--quiet", action="store_true")
    cal.set_defaults(func=cmd_calibrate)
    fid = sub.add_parser("fidelity", help="the same seeded workload on the real and the calibrated backend")
    fid.add_argument("--profile", required=True, help="the calibrated profile to check (name or JSON path)")
    fid.add_argument("--workload", default="cpu-fidelity", choices=sorted(WORKLOADS), metavar="WORKLOAD",
                     help="a named workload (default: cpu-fidelity)")
    fid.add_argument("--max-requests", type=positive_int, default=None,
                     help="only the workload's first N requests (a short run)")
    fid.add_argument("--policy", nargs="+", default=["fcfs", "twp", "flow-control"],
                     help="policies to run on both backends (default: fcfs twp flow-control)")
    fid.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0, 1, 2],
                     help="episode seeds (default: 0 1 2)")
    fid.add_argument("--repeats", type=positive_int, default=2,
                     help="real runs per seed, whose spread is the noise beside each error (default: 2)")
    fid.add_argument("--quiet", action="store_true")
    fid.add_argument("--threads", type=positive_int, default=None,
                     help="torch CPU threads (default: those the profile was calibrated with)")
    fid.add_argument("--out", default=None, help="folder for fidelity.csv and fidelity.md (default: print only)")
    fid.add_argument("--speed-only", action="store_true",
                     help="run only the speed probe: how fast the machine runs now against the profile (seconds)")
    _model_args(fid, "the one the profile was fitted on, when recorded")
    fid.set_defaults(func=cmd_fidelity)
