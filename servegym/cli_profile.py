"""``servegym profile``: list, show, predict with and build calibrated-backend profiles."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from servegym.backends import Profile, TokenLatencyModel, load_profile, shipped_profiles
from servegym.backends.profile import measured_range
from servegym.backends.runtimes import DEFAULT_RUNTIME, LEGACY_RUNTIME, RUNTIMES
from servegym.cli_args import non_negative_int, positive_int, writable_dir


def _summary(profile: Profile) -> tuple[str, ...]:
    prov = profile.provenance
    tp = str(prov.get("model_shape", {}).get("tensor_parallel", 1))
    source = prov.get("source", prov.get("method", ""))
    if isinstance(source, dict):
        source = f"{source['repository']} @ {source['commit'][:7]}"
    kv_tokens = f"{profile.num_kv_blocks * profile.block_size:,}"
    return (profile.name, prov.get("hardware", "?"), prov.get("model", "?"), tp, kv_tokens,
            profile.runtime or "-", str(source)[:70])


def cmd_list(args: argparse.Namespace) -> int:
    rows = [("name", "GPU", "model", "TP", "KV tokens", "runtime", "source")]
    rows += [_summary(load_profile(name)) for name in shipped_profiles()]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:6], widths, strict=True)) + "  " + row[6])
    return 0


def _named(args: argparse.Namespace) -> Profile:
    """The profile ``args.name`` under ``--runtime`` when given (``NAME@RUNTIME`` works too)."""
    runtime = getattr(args, "runtime", None)
    return load_profile(f"{args.name}@{runtime}" if runtime else args.name)


def cmd_runtimes(args: argparse.Namespace) -> int:
    from servegym.backends.build import GPUS, runtime_terms

    for runtime in RUNTIMES.values():
        default = " (default of the shipped profiles)" if runtime.name == DEFAULT_RUNTIME else ""
        print(f"{runtime.name}{default}: {runtime.summary}")
        for gpu in GPUS:
            print(f"  {gpu}:")
            for key, line in runtime_terms(gpu, runtime).items():
                print(f"    {key} = {line}")
    print(f"A schema-2 file without a runtime key describes {LEGACY_RUNTIME!r} (its terms came from Vidur's tables).")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from servegym.backends.runtime_fit import TOLERANCE, compare, coverage

    print("| profile | runtime | shape | measured (ms) | predicted (ms) | error | use | source |")
    print("|---|---|---|---|---|---|---|---|")
    for ref, predicted in compare():
        print(f"| `{ref.profile}` | {ref.runtime} | {ref.label} | {ref.measured_s * 1e3:,.1f} | "
              f"{predicted * 1e3:,.1f} | {predicted / ref.measured_s - 1:+.1%} | "
              f"{'fit' if ref.fitted else 'check'} | {ref.source} |")
    print(f"\nIssue 28's shapes: the cited measurements' range against the predictions of them (in range: within "
          f"{TOLERANCE:.0%} of it)\n")
    print("| profile | runtime | shape | cited | measured (ms) | predicted (ms) | verdict |")
    print("|---|---|---|---|---|---|---|")

    def span(values: tuple[float, ...]) -> str:
        return "" if not values else f"{min(values) * 1e3:,.1f}" + (
            f"-{max(values) * 1e3:,.1f}" if len(values) > 1 else "")

    for cell in coverage():
        print(f"| `{cell.profile}` | {cell.runtime} | {cell.shape} | {len(cell.measured_s)} | "
              f"{span(cell.measured_s)} | {span(cell.predicted_s)} | {cell.verdict} |")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    profile = _named(args)
    data = profile.to_json()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{profile.name}: {data['provenance'].get('hardware')}, {data['provenance'].get('model')}")
    print(f"schema {data['schema_version']}; KV {profile.num_kv_blocks:,} blocks of {profile.block_size} tokens; "
          f"cold start {profile.cold_start_s} s")
    print(f"runtime: {profile.runtime or 'none (schema 1: one measured or stated model)'}")
    lat = profile.latency
    print(f"decode floor l_min {lat.l_min_s * 1e3:.2f} ms, saturation batch B0 {lat.saturation_batch}")
    if isinstance(lat, TokenLatencyModel):
        from servegym.backends.build import fit_report

        print("terms (fit error against the table each came from):")
        for line in fit_report(profile):
            print(f"  {line}")
        build = profile.provenance.get("build")
        if isinstance(build, dict) and profile.runtime in RUNTIMES:
            from servegym.backends.build import runtime_terms

            print(f"runtime numbers ({profile.runtime}, {build['gpu']}):")
            for key, line in runtime_terms(build["gpu"], RUNTIMES[profile.runtime]).items():
                print(f"  {key} = {line}")
    else:
        for key, value in data["latency"].items():
            print(f"  {key} = {value}")
    for key in ("method", "date"):
        print(f"{key}: {data['provenance'].get(key)}")
    return 0


def shape_warnings(profile: Profile, batch: int, context: int, prefill: int | None) -> list[str]:
    """One line per way the iteration ``predict`` times exceeds what the profile knows: its KV capacity (blocks
    x block size) or its measured range; each says by how much."""
    per_request = prefill if prefill is not None else context
    what = "batch x prompt" if prefill is not None else "batch x context"
    blocks = batch * -(-per_request // profile.block_size)
    lines = []
    if blocks > profile.num_kv_blocks:
        lines.append(f"{what} = {batch * per_request:.3g} tokens ({blocks:,} blocks of {profile.block_size}) is "
                     f"{blocks / profile.num_kv_blocks:.3g} x the KV capacity of "
                     f"{profile.num_kv_blocks * profile.block_size:,} tokens ({profile.num_kv_blocks:,} blocks), "
                     f"{blocks - profile.num_kv_blocks:,} blocks over")
    shape = {"rows": batch, "tokens": batch * (prefill or 1), "context": per_request}
    names = {"rows": "requests per iteration", "tokens": "tokens per iteration", "context": "tokens per request"}
    for key, top in measured_range(profile).items():
        if shape[key] > top:
            lines.append(f"{shape[key]:,} {names[key]} is {shape[key] / top:.3g} x the largest measured "
                         f"({top:,.0f}); the time is extrapolated")
    return lines


def cmd_predict(args: argparse.Namespace) -> int:
    profile = _named(args)
    lat = profile.latency
    if args.prefill is not None:
        if args.context:
            raise ValueError("--context describes decodes; a prefill-only iteration has none")
        if profile.runtime in RUNTIMES:  # the runtime splits a batch of prompts by its token budget
            from servegym.backends.runtime_fit import prefill_iterations_s

            budget = int(RUNTIMES[profile.runtime].max_batched_tokens.value)
            seconds = prefill_iterations_s(lat, args.prefill, args.batch, budget)
        else:
            seconds = lat.prefill_s(args.prefill, args.batch)
    else:
        seconds = lat.decode_s(args.batch, args.context)
    for line in shape_warnings(profile, args.batch, args.context, args.prefill):
        print(f"servegym profile predict: warning: {line}", file=sys.stderr)
    print(f"servegym profile predict: {profile.name}, runtime {profile.runtime or 'none (schema 1)'}",
          file=sys.stderr)
    print(f"{seconds * 1e3:.3f}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from servegym.backends.build import TABLES, build_profile, fit_report, rebuild_shipped

    tables = Path(args.tables) if args.tables else TABLES
    out = writable_dir(Path(args.out))
    if args.all:
        for path in rebuild_shipped(out, tables):
            print(f"wrote {path}")
        return 0
    if not (args.gpu and args.model):
        raise ValueError("give --gpu and --model (and --tp), or --all")
    profile = build_profile(args.gpu, args.model, args.tp, tables)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{profile.name}.json"
    profile.save(path)
    for line in fit_report(profile):
        print(f"  {line}")
    print(f"wrote {path}")
    return 0


def add_profile_parser(sub: Any) -> None:
    """Add ``servegym profile`` to ``sub`` (the parser's ``add_subparsers()`` result)."""
    prof = sub.add_parser("profile", help="list, show, predict with or build calibrated-backend profiles")
    verbs = prof.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="name, GPU, model, TP, KV capacity, runtime and source of every shipped profile") \
        .set_defaults(func=cmd_list)
    verbs.add_parser("runtimes", help="the serving runtimes a profile can model, each number with its source") \
        .set_defaults(func=cmd_runtimes)
    verbs.add_parser("check", help="every cited whole-iteration measurement beside the profiles' prediction") \
        .set_defaults(func=cmd_check)
    runtime_help = f"serving runtime ({', '.join(RUNTIMES)}; default: the profile's own)"
    show = verbs.add_parser("show", help="every term of a profile and its provenance")
    show.add_argument("name", help="shipped name or JSON path")
    show.add_argument("--runtime", choices=sorted(RUNTIMES), default=None, help=runtime_help)
    show.add_argument("--json", action="store_true", help="the profile file as JSON")
    show.set_defaults(func=cmd_show)
    pred = verbs.add_parser(
        "predict", help="one iteration's time in ms",
        description="Print one iteration's predicted time in milliseconds (ms): --batch decoding requests each "
                    "holding --context KV tokens, or (--prefill P) --batch prompts of P tokens prefilled whole, in "
                    "iterations of at most the runtime's token budget. "
                    "Warns on stderr when the shape exceeds the profile's KV capacity or its measured range.")
    pred.add_argument("name", help="shipped name or JSON path")
    pred.add_argument("--runtime", choices=sorted(RUNTIMES), default=None, help=runtime_help)
    pred.add_argument("--batch", type=positive_int, default=1, help="decoding requests (or prompts with --prefill)")
    pred.add_argument("--context", type=non_negative_int, default=0, help="KV tokens each decoding request holds")
    pred.add_argument("--prefill", type=positive_int, default=None, help="prefill --batch prompts of this many tokens")
    pred.set_defaults(func=cmd_predict)
    build = verbs.add_parser("build", help="build schema-2 profiles from Vidur-format tables")
    build.add_argument("--gpu", help="a100, h100 or a40")
    build.add_argument("--model", help="llama3-8b, llama2-7b or llama2-70b")
    build.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    build.add_argument("--all", action="store_true", help="rebuild every shipped profile")
    build.add_argument("--tables", default=None, help="folder of Vidur-format tables (default: the bundled copy)")
    build.add_argument("--out", default="profiles", help="output folder")
    build.set_defaults(func=cmd_build)
