"""The ``attnjax`` command line."""

import argparse
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from attnjax import experiment
from attnjax.attention import attention
from attnjax.experiment import claims as experiment_claims
from attnjax.experiment import record, storage
from attnjax.experiment.sweep import edge_points, summary_table
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


def _progress_bar(prefix: str, step: int, total: int, width: int = 30) -> None:
    done = width * step // total
    end = "\n" if step >= total else ""
    print(f"\r{prefix} [{'#' * done}{'.' * (width - done)}] {step}/{total}", end=end,
          file=sys.stderr, flush=True)  # fmt: skip


def _point_progress(point: str, step: int, total: int) -> None:
    """One line per finished evaluation chunk (points run in parallel, so no bars)."""
    print(f"{point:<48} step {step}/{total}", file=sys.stderr, flush=True)


def _overrides(pairs: list[str]) -> dict[str, object]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected section.field=value")
        out[key.strip()] = experiment.parse_value(value.strip())
    return out


def run(args: argparse.Namespace) -> None:
    module = experiment.load_file(args.config)
    config = module.get_config("smoke" if args.smoke else args.variant)
    config = experiment.with_overrides(config, _overrides(args.set))
    out = args.out or Path("runs") / config.name
    experiment.train_and_evaluate(
        config, out, num_seeds=args.seeds, overwrite=args.overwrite,
        progress=lambda step, total: _progress_bar(config.name, step, total),
    )  # fmt: skip
    print((Path(out) / "report.md").read_text())
    print(f"run folder: {out}")


def sweep(args: argparse.Namespace) -> None:
    """Run an experiment file: its ``analyze(out, smoke)`` (measurements, and training of its
    own) and/or its ``get_experiment(smoke)`` sweep; write the record (``report.md`` with a
    verdict line per claim, ``results.csv``, ``env.json``) and, with ``--publish``, copy it
    to ``results/<experiment>/``."""
    module = experiment.load_file(args.experiment)
    if not hasattr(module, "analyze") and not hasattr(module, "get_experiment"):
        raise SystemExit(f"{args.experiment}: defines neither analyze() nor get_experiment()")
    name = Path(args.experiment).stem
    if args.publish and args.smoke:
        raise SystemExit("--publish: a smoke run is not a record; drop --smoke or --publish")
    out = args.out or Path("runs") / name
    out.mkdir(parents=True, exist_ok=True)
    for stale in record.RECORD_FILES:  # this run writes its own
        (out / stale).unlink(missing_ok=True)
    environment = record.environment(args.argv)  # the code as the run starts
    verdicts, bodies = {}, []
    if hasattr(module, "analyze"):
        analysis = module.analyze(out, args.smoke)
        storage.write_csv(out / analysis.csv_name, analysis.rows)
        verdicts |= analysis.verdicts
        bodies.append(analysis.body)
        print(f"\n{analysis.body}")
    if hasattr(module, "get_experiment"):
        exp = module.get_experiment(smoke=args.smoke)
        outcome = experiment.sweep(
            exp, out, num_seeds=args.seeds, overwrite=args.overwrite, workers=args.workers,
            progress=_point_progress,
        )  # fmt: skip
        verdicts[outcome.claim_id] = (outcome.verdict, outcome.reason)
        bodies.append(outcome.body)
        print(f"\n{exp.name}: {exp.claim}\n")
        print(summary_table(outcome.summary, exp))
        for point in edge_points(outcome.summary):
            print(f"best learning rate at the edge of the grid: {point}")
    record.write_report(out, verdicts, bodies)
    storage.write_json(out / "env.json", environment)
    print(record.verdict_lines(verdicts), end="")
    print(f"report: {out / 'report.md'}")
    if args.publish:  # the project's results/, beside experiments/
        dest = Path(args.experiment).resolve().parents[1] / "results" / name
        record.publish(out, dest)
        print(f"published: {dest}")


def claims(args: argparse.Namespace) -> None:
    """Rewrite (or with ``--check`` compare) the generated blocks of docs/claims.md and
    README.md from the records in results/; exit 1 on a stale block (``--check``), a missing
    or unknown block, or a record without the verdict of its claim."""
    changed = experiment_claims.update(args.root, check=args.check)
    problems = experiment_claims.problems(args.root) + (changed if args.check else [])
    if problems:
        raise SystemExit("claims: " + "; ".join(problems) + " (run `attnjax claims`)")
    print("rewritten: " + ("; ".join(changed) or "none"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="attnjax", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="scaling and saturation of dot-product scores; parity check")
    for name, target, help_text in [
        ("run", "config", "train one config file's get_config() into a run folder"),
        ("sweep", "experiment", "run an experiment file (analyze() and/or grid × seeds), verdicts"),
    ]:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(target, help="a Python file (it is code: run only files you trust)")
        sub.add_argument("--seeds", type=int, default=5 if name == "sweep" else 1)
        sub.add_argument("--out", type=Path, help="output folder (default runs/<name>)")
        sub.add_argument("--smoke", action="store_true", help="a seconds-long version")
        sub.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    commands.choices["run"].add_argument("--variant", help="passed to get_config")
    commands.choices["sweep"].add_argument(
        "--workers", type=int, default=2, help="points trained in parallel (threads)"
    )
    commands.choices["sweep"].add_argument(
        "--publish", action="store_true",
        help="copy the record (report, tables, figures, env.json) to results/<experiment>/",
    )  # fmt: skip
    commands.choices["run"].add_argument(
        "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
        help="override a config field; the value is parsed as a Python literal",
    )  # fmt: skip
    sub = commands.add_parser(
        "claims", help="generate the claims tables of docs/claims.md and README.md from results/"
    )
    sub.add_argument("--root", type=Path, default=Path("."), help="the project folder")
    sub.add_argument("--check", action="store_true", help="exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    commands = {"demo": lambda _: demo(), "run": run, "sweep": sweep, "claims": claims}
    commands[args.command](args)


if __name__ == "__main__":
    main()
