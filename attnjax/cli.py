"""The ``attnjax`` command line."""

import argparse
import contextlib
import dataclasses
import functools
import inspect
import math
import os
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import rich.console
import rich.progress

from attnjax import experiment
from attnjax.attention import attention
from attnjax.experiment import audit as experiment_audit
from attnjax.experiment import claims as experiment_claims
from attnjax.experiment import recompute, record, report, storage
from attnjax.experiment.sweep import check_pilot, check_points, edge_points, seeds, summary_table
from attnjax.scores import dot, scaled_dot


def demo(num_samples: int = 4096, num_keys: int = 16) -> None:
    """Why scores are scaled (Vaswani et al., 2017), measured with the functional core.

    For unit-variance q, k the unscaled logit variance grows as H and softmax saturates;
    ``scaled_dot`` keeps both flat. Then ``attention`` is checked against ``jax.nn``.
    """
    print(f"softmax over {num_keys} keys, {num_samples} random queries, q, k ~ N(0, I_H)")
    print(
        f"{'H':>6} {'Var dot':>9} {'Var scaled':>11} {'max w dot':>10} {'max w scaled':>13}"
        f" {'H(w) dot':>9} {'H(w) scaled':>12}"
    )
    for head_dim in (4, 16, 64, 256, 1024):
        kq, kk = jax.random.split(jax.random.key(head_dim))
        q = jax.random.normal(kq, (num_samples, 1, head_dim))
        k = jax.random.normal(kk, (num_samples, num_keys, head_dim))
        row = [head_dim]
        stats = [_softmax_stats(fn(q, k)) for fn in (dot, scaled_dot)]
        row += [s[0] for s in stats] + [s[1] for s in stats] + [s[2] for s in stats]
        print("{:>6} {:>9.1f} {:>11.3f} {:>10.3f} {:>13.3f} {:>9.3f} {:>12.3f}".format(*row))
    print(f"(uniform weights: max w = {1 / num_keys:.3f}, entropy = {math.log(num_keys):.3f} nats)")

    print("\nattention vs jax.nn.dot_product_attention (B=2, T=S=128, N=8, K=2, H=64, causal)")
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 128, 8, 64))
    k, v = (jax.random.normal(key, (2, 128, 2, 64)) for key in keys[1:])
    ours = jax.jit(lambda q, k, v: attention(q, k, v, is_causal=True))(q, k, v)
    ref = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))(q, k, v)
    print(f"max |difference| = {float(jnp.max(jnp.abs(ours - ref))):.2e}")


def _softmax_stats(logits: jax.Array) -> tuple[float, float, float]:
    """Variance of the logits, mean largest softmax weight, mean entropy (nats)."""
    weights = jax.nn.softmax(logits, axis=-1)
    entropy = -jnp.sum(weights * jnp.log(jnp.maximum(weights, 1e-30)), axis=-1)
    return float(jnp.var(logits)), float(weights.max(-1).mean()), float(entropy.mean())


class Progress:
    """Training progress on stderr: points done of the total, and each running point's step,
    loss and time left. Live bars (rich) on a terminal; plain lines otherwise (one per
    evaluation chunk). Called from the sweep's worker threads as ``(point, step, total,
    loss)``. A point trained again (a grown rate grid) gets a clock of its own and counts once
    among the points done. Across processes only process 0 shows it; the others stay quiet."""

    def __init__(self, num_points: int | None = None):
        self.console = rich.console.Console(stderr=True)
        self.num_points, self.done = num_points, set()
        self.lock = threading.Lock()
        self.started: dict[str, tuple[float, int]] = {}
        self.bars = None
        self.quiet = jax.process_index() != 0
        if self.console.is_terminal and not self.quiet:
            self.bars = rich.progress.Progress(
                rich.progress.TextColumn("{task.description}"),
                rich.progress.BarColumn(),
                rich.progress.MofNCompleteColumn(),
                rich.progress.TextColumn("{task.fields[loss]}"),
                rich.progress.TimeRemainingColumn(),
                console=self.console,
            )
            self.tasks = {}
            if num_points is not None:
                self.points = self.bars.add_task("points", total=num_points, loss="")

    def __enter__(self) -> "Progress":
        if self.bars is not None:
            self.bars.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bars is not None:
            self.bars.stop()

    def __call__(self, point: str, step: int, total: int, loss: float) -> None:
        if self.quiet:
            return
        with self.lock:
            start_time, start_step = self.started.setdefault(point, (time.monotonic(), step))
            finished = step >= total
            if finished:  # a later training of this point starts its own clock
                del self.started[point]
                self.done.add(point)
            if self.bars is None:
                rate = (time.monotonic() - start_time) / max(step - start_step, 1)
                left = "" if step == start_step else f"  {rate * (total - step):.0f} s left"
                count = "" if self.num_points is None else f"[{len(self.done)}/{self.num_points}] "
                print(f"{count}{point}  step {step}/{total}  loss {loss:.4f}{left}",
                      file=sys.stderr, flush=True)  # fmt: skip
                return
            if point not in self.tasks:
                self.tasks[point] = self.bars.add_task(point, total=total, loss="")
            self.bars.update(self.tasks[point], completed=step, loss=f"loss {loss:.4f}")
            if finished:
                self.bars.remove_task(self.tasks.pop(point))
                if self.num_points is not None:
                    self.bars.update(self.points, completed=len(self.done))


SMOKE_HELP = (  # measured on 2 CPU cores without a compilation cache
    "a few steps of every run, to check that the code runs; it judges no claim. Seconds to "
    "minutes, mostly compiling: `run configs/xor_relation.py` 12 s, `sweep "
    "experiments/xor_relation.py` (24 points) 2.6 min"
)


class UsageError(Exception):
    """A mistake in the command or its config: one line on stderr, exit status 2."""


@contextlib.contextmanager
def _folder_errors():
    """A folder that holds another record (checked before any training) is a usage error."""
    try:
        yield
    except FileExistsError as error:
        raise UsageError(str(error)) from error


def _usage_errors(fn):
    """Turn the config, override and missing-dependency errors raised inside ``fn`` into
    :class:`UsageError`."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, ImportError) as error:
            raise UsageError(str(error)) from error

    return wrapped


@_usage_errors
def _run_config(args: argparse.Namespace) -> experiment.ExperimentConfig:
    module = experiment.load_file(args.config)
    config = experiment.get_config(module, "smoke" if args.smoke else args.variant)
    config = experiment.with_overrides(config, experiment.parse_overrides(config, args.set))
    if config.train.tensorboard:
        storage.require_tensorboard()
    return config


def run(args: argparse.Namespace) -> None:
    """Train a config file's config into ``--out`` (default ``runs/<config name>``)."""
    config = _run_config(args)
    out = args.out or Path("runs") / config.name
    with _folder_errors():  # before any folder is made
        record.check_folder(out, "run", args.config, args.overwrite)
        experiment.check_workdir(config, out, num_seeds=args.seeds, overwrite=args.overwrite)
    primary = jax.process_index() == 0  # across processes, process 0 writes the folder
    if primary:
        record.mark_folder(out, "run", args.config, args.argv)
    with Progress() as progress, _folder_errors():
        experiment.train_and_evaluate(
            config, out, num_seeds=args.seeds, overwrite=args.overwrite,
            progress=functools.partial(progress, config.name),
            smoke=args.smoke or args.variant == "smoke",
        )  # fmt: skip
    if primary:
        print((Path(out) / "report.md").read_text())
        print(f"run folder: {out}")


@_usage_errors
def _sweep_plan(args: argparse.Namespace):
    """``(module, experiment or None)``: the file, and its sweep with ``--set`` applied to
    the base config."""
    module = experiment.load_file(args.experiment)
    if experiment.file_kind(module) != "sweep":
        hint = "; a config file runs with `attnjax run`" if hasattr(module, "get_config") else ""
        raise ValueError(
            f"experiment: {args.experiment} defines neither analyze() nor get_experiment(){hint}"
        )
    if args.publish and args.smoke:
        raise ValueError("--publish: a smoke run is not a record; drop --smoke or --publish")
    if not hasattr(module, "get_experiment"):
        if args.set:
            raise ValueError(f"--set: {args.experiment} has no sweep (get_experiment) to change")
        return module, None
    exp = module.get_experiment(smoke=args.smoke)
    overrides = experiment.parse_overrides(exp.base, args.set)
    exp = dataclasses.replace(exp, base=experiment.with_overrides(exp.base, overrides))
    if args.publish:  # before anything trains
        check_pilot(exp, args.seeds or 5)
    if exp.base.train.tensorboard or any(p.get("train.tensorboard") for p in exp.points):
        storage.require_tensorboard()
    return module, exp


@_usage_errors
def _analysis_options(module, args: argparse.Namespace) -> dict[str, object]:
    """``seeds`` (when given on the command line) and ``overwrite`` for the file's
    ``analyze``; ``--seeds`` for a file whose only part, its analysis, takes no seeds is an
    error (a file with a sweep too uses them there)."""
    options = {"overwrite": args.overwrite, **getattr(args, "analysis_options", {})}
    if args.seeds is not None:
        if "seeds" in inspect.signature(module.analyze).parameters:
            options["seeds"] = args.seeds
        elif not hasattr(module, "get_experiment"):
            raise ValueError(f"--seeds: {args.experiment}'s analysis takes no seeds")
    return options


def sweep(args: argparse.Namespace) -> None:
    """Run an experiment file: its ``analyze(out, smoke)`` (measurements, and training of its
    own) and/or its ``get_experiment(smoke)`` sweep (``--set`` changes its base config; the
    points' own overrides win); write the record (``report.md`` with a verdict line per claim,
    ``results.csv``, ``env.json``) into ``--out`` (default ``sweeps/<experiment>``) and, with
    ``--publish``, copy it to ``results/<experiment>/``. A smoke run judges no claim."""
    module, exp = _sweep_plan(args)
    options = _analysis_options(module, args) if hasattr(module, "analyze") else {}
    name = Path(args.experiment).stem
    out = args.out or Path("sweeps") / name
    num_seeds = args.seeds or 5
    with _folder_errors():  # before any folder is made
        record.check_folder(out, "sweep", args.experiment, args.overwrite)
        if exp is not None:
            check_points(exp, out, num_seeds=num_seeds, overwrite=args.overwrite)
    primary = jax.process_index() == 0  # across processes, process 0 writes the record
    say = print if primary else lambda *_, **__: None
    out.mkdir(parents=True, exist_ok=True)
    if primary:
        record.mark_folder(out, "sweep", args.experiment, args.argv)
        for stale in record.RECORD_FILES:  # this run writes its own
            (out / stale).unlink(missing_ok=True)
    environment = record.environment(args.argv)  # the code as the run starts
    if exp is not None:  # the record's seeds, and the pilot's they must not include
        environment |= {"seeds": list(seeds(exp, num_seeds)), "pilot_seeds": list(exp.pilot_seeds)}
    verdicts, bodies = {}, []
    if hasattr(module, "analyze"):
        with _folder_errors(), report.smoke_figures(args.smoke), Progress() as progress:
            if "progress" in inspect.signature(module.analyze).parameters:
                options["progress"] = progress
            analysis = module.analyze(out, args.smoke, **options)
        if primary:
            storage.write_csv(out / analysis.csv_name, analysis.rows)
        verdicts |= analysis.verdicts
        bodies.append(analysis.body)
        say(f"\n{analysis.body}")
    if exp is not None:
        with Progress(len(exp.points)) as progress, _folder_errors():
            outcome = experiment.sweep(
                exp, out, num_seeds=num_seeds, overwrite=args.overwrite, workers=args.workers,
                progress=progress, smoke=args.smoke,
            )  # fmt: skip
        verdicts[outcome.claim_id] = (outcome.verdict, outcome.reason)
        bodies.append(outcome.body)
        say(f"\n{exp.name}: {exp.claim}\n")
        say(summary_table(outcome.summary, exp))
        for point in edge_points(outcome.summary):
            say(f"best learning rate at the edge of the grid: {point}")
    if not primary:
        return
    record.write_report(out, verdicts, bodies, smoke=args.smoke)
    storage.write_json(out / "env.json", environment)
    print(record.verdict_lines(verdicts, smoke=args.smoke), end="")
    print(f"report: {out / 'report.md'}")
    if args.publish:  # the project's results/, beside experiments/
        dest = Path(args.experiment).resolve().parents[1] / "results" / name
        record.publish(out, dest)
        print(f"published: {dest}")


def atlas(args: argparse.Namespace) -> None:
    """The expressiveness atlas, ``experiments/atlas.py`` of the repository (``--root``): the
    sweep command on it, ``--tasks`` and ``--scores`` choosing a subset (which judges nothing
    and is not published); a run invoked again resumes from its folder."""
    args.experiment = _atlas_file(args)
    args.analysis_options = {"tasks": tuple(args.tasks), "scores": tuple(args.scores)}
    sweep(args)


@_usage_errors
def _atlas_file(args: argparse.Namespace) -> str:
    """The repository's ``experiments/atlas.py``, once the subset and ``--publish`` are
    checked."""
    root = _claims_root(args.root)
    if args.publish and (args.tasks or args.scores):
        raise ValueError("--publish: a subset (--tasks, --scores) is not the atlas's record")
    path = str(root / "experiments" / "atlas.py")
    experiment.load_file(path).check_subset(args.smoke, args.tasks, args.scores)
    return path


def _claims_root(root: Path | None) -> Path:
    """``--root``, or the repository holding the current folder."""
    if root is None:
        found = experiment_claims.find_root(Path.cwd())
        if found is None:
            raise UsageError(
                f"{Path.cwd()} is not inside the attnjax repository (no docs/claims.md and "
                "results/ here or above); run it there or pass --root"
            )
        return found
    if not (root / "docs" / "claims.md").is_file():
        raise UsageError(f"--root: {root} holds no docs/claims.md (the attnjax repository?)")
    return root


def claims(args: argparse.Namespace) -> None:
    """Rewrite (or with ``--check`` compare) the generated blocks of docs/claims.md and
    README.md from the records in results/ and print the claims' verdicts; exit 1 on a stale
    block (``--check``), a missing or unknown block, or a record without the verdict of its
    claim; ``--check`` also recomputes each record's ``report.md`` from its tables
    (:mod:`attnjax.experiment.recompute`) and exits 1 on a difference, naming the record and
    where. The repository is ``--root`` or the one holding the current folder."""
    root = _claims_root(args.root)
    if args.check:  # a record that its own tables contradict comes first, before any audit
        differ, unchecked = recompute.differences(root, experiment_claims.EXPERIMENTS)
        if differ:
            raise SystemExit("claims: records differ from their tables: " + "; ".join(differ))
    changed = experiment_claims.update(root, check=args.check)
    problems = experiment_claims.problems(root) + (changed if args.check else [])
    if problems:
        raise SystemExit("claims: " + "; ".join(problems) + " (run `attnjax claims`)")
    print(experiment_claims.blocks(root)["readme"])
    if args.check:
        print(f"up to date: {', '.join(experiment_claims.TARGETS)} ({root})")
        print(
            "each record's report.md recomputed from its tables"
            + "".join(f"\nnot recomputed: {u}" for u in unchecked)
        )
    else:
        print(f"rewritten ({root}): " + ("; ".join(changed) or "none (already up to date)"))


@_usage_errors
def audit(args: argparse.Namespace) -> None:
    """Audit the verdict rule of each experiment with a committed record (``results/<name>/
    results.csv``; trained sweeps and analyses), or of the experiments named: the verdicts it
    can reach, the bootstrap agreement of its committed verdict, its edge learning rates, the
    smallest margin of its decisive comparisons in standard errors, its checks and its can/does
    parts (:mod:`attnjax.experiment.audit`); print the table, a row per claim."""
    root = _claims_root(args.root)

    def progress(name: str) -> None:
        print(f"auditing {name}", file=sys.stderr)

    audits = experiment_audit.audit_records(root, args.experiments, args.draws, progress)
    print(experiment_audit.audit_table(audits))


def _compile_cache() -> None:
    """JAX's persistent compilation cache, on by default in the user's cache folder
    (``$XDG_CACHE_HOME/attnjax/jax`` or ``~/.cache/attnjax/jax``): a rerun skips compiling.
    ``JAX_COMPILATION_CACHE_DIR`` chooses another folder; ``ATTNJAX_COMPILE_CACHE=0`` turns
    it off."""
    if os.environ.get("ATTNJAX_COMPILE_CACHE", "1") == "0":
        return
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(cache_folder("jax")))


def cache_folder(name: str) -> Path:
    """attnjax's folder ``name`` in the user's cache: ``$XDG_CACHE_HOME/attnjax/<name>``, or
    ``~/.cache/attnjax/<name>`` without it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnjax" / name


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line on stderr, exit status 2, like :class:`UsageError`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive(text: str) -> int:
    """An integer ≥ 1 (seeds, workers)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="attnjax", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="scaling and saturation of dot-product scores; parity check")
    for name, target, folder, help_text in [
        ("run", "config", "runs/<config name>",
         "train one config file's get_config() into a run folder"),
        ("sweep", "experiment", "sweeps/<experiment>",
         "run an experiment file (analyze() and/or grid × seeds), verdicts"),
    ]:  # fmt: skip
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(target, help="a Python file (it is code: run only files you trust)")
        sub.add_argument(
            "--seeds", type=_positive, default=None if name == "sweep" else 1,
            help="seeds per point (sweep: 5, or an analysis' own count, unless given)",
        )  # fmt: skip
        sub.add_argument(
            "--out", type=Path,
            help=f"output folder (default {folder}); it records which command wrote it, and "
            "no other command writes there without --overwrite",
        )  # fmt: skip
        sub.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
        sub.add_argument(
            "--overwrite", action="store_true",
            help=f"take a folder holding another record: replace this {name}'s own files "
            "(never other files in the folder)",
        )  # fmt: skip
        sub.add_argument(
            "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
            help="override a config field (of a sweep's base config); parsed by the field's "
            "type: true/false, none, 1_000, 3e-4, (1, 2)",
        )  # fmt: skip
        sub.add_argument(
            "--tensorboard", action="store_true",
            help="also log metrics for TensorBoard in <run>/tensorboard/ (train.tensorboard)",
        )  # fmt: skip
        sub.add_argument(
            "--patching", action="store_true",
            help="also write run 0's activation patching heatmaps, patching.png (train.patching)",
        )  # fmt: skip
        sub.add_argument("--debug", action="store_true", help="show tracebacks of usage errors")
    commands.choices["run"].add_argument(
        "--variant", help="passed to get_config (one of the file's VARIANTS)"
    )
    commands.choices["sweep"].add_argument(
        "--workers", type=_positive, default=2, help="points trained in parallel (threads)"
    )
    commands.choices["sweep"].add_argument(
        "--publish", action="store_true",
        help="copy the record (report, tables, figures, env.json) to results/<experiment>/",
    )  # fmt: skip
    sub = commands.add_parser(
        "atlas", help="every score on every synthetic task (experiments/atlas.py); resumes"
    )
    sub.add_argument("--tasks", nargs="+", default=[], help="columns or tasks (default: all)")
    sub.add_argument("--scores", nargs="+", default=[], help="scores (default: all six)")
    sub.add_argument("--seeds", type=_positive, default=None, help="seeds per cell (default 5)")
    sub.add_argument("--out", type=Path, help="output folder (default sweeps/atlas)")
    sub.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    sub.add_argument("--overwrite", action="store_true", help="replace the atlas's own files")
    sub.add_argument("--publish", action="store_true", help="copy the record to results/atlas/")
    sub.add_argument(
        "--root", type=Path, help="the repository (default: the one holding the current folder)"
    )
    sub.add_argument("--debug", action="store_true", help="show tracebacks of usage errors")
    sub.set_defaults(set=[], workers=2)
    sub = commands.add_parser(
        "claims", help="generate the claims tables of docs/claims.md and README.md from results/"
    )
    sub.add_argument(
        "--root", type=Path, help="the repository (default: the one holding the current folder)"
    )
    sub.add_argument(
        "--check", action="store_true",
        help="exit 1 if a block is out of date or a record's report.md is not what its tables give",
    )  # fmt: skip
    sub = commands.add_parser(
        "audit", help="can each record's rule come out either way; is its verdict fragile"
    )
    sub.add_argument("experiments", nargs="*", help="names under results/ (default: all)")
    sub.add_argument(
        "--root", type=Path, help="the repository (default: the one holding the current folder)"
    )
    sub.add_argument(
        "--draws",
        type=_positive,
        default=1000,
        help="bootstrap draws of a trained sweep (fixed key)",
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if getattr(args, "tensorboard", False):
        args.set.append("train.tensorboard=true")
    if getattr(args, "patching", False):
        args.set.append("train.patching=true")
    commands = {"demo": lambda _: demo(), "run": run, "sweep": sweep, "claims": claims,
                "audit": audit, "atlas": atlas}  # fmt: skip
    _compile_cache()
    try:
        commands[args.command](args)
    except UsageError as error:
        if getattr(args, "debug", False):
            raise (error.__cause__ or error) from None
        print(f"attnjax {args.command}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
