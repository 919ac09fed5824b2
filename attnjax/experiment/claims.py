"""The claims and their published records: ``results/<experiment>/`` → the generated blocks
of ``docs/claims.md`` and ``README.md``.

A generated block sits between ``<!-- claims:NAME -->`` and ``<!-- claims:end -->``; only what
is between the markers is rewritten. Blocks: ``summary`` (every claim, its experiments and
verdicts) and ``results:<experiment>`` (the experiment's report) in ``docs/claims.md``, and
``readme`` in ``README.md``.
"""

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

from attnjax.experiment import storage
from attnjax.experiment.audit import audit_records, audit_table
from attnjax.experiment.report import markdown_table

BLOCK = re.compile(
    r"(<!-- claims:(?P<name>[\w:.-]+) -->\n)(?P<body>.*?)(<!-- claims:end -->)", re.S
)
VERDICT_LINE = re.compile(r"verdict (?P<claim>.+?): (?P<verdict>supported|refuted|inconclusive)")


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim of ``docs/sources.md`` (``id``, e.g. ``"E1"``), what it says in a few words, the
    experiments (``experiments/<name>.py``) that judge it, its ``previous`` verdict (the one
    docs/claims.md gave before records: 3 seeds, one fixed test batch per split) and, for a
    claim whose experiment was redesigned because its verdict could not come out against the
    claim, the ``earlier_design``'s recorded verdict ("" when not redesigned)."""

    id: str
    title: str
    experiments: tuple[str, ...]
    previous: str
    earlier_design: str = ""


NEW = "no experiment"
CLAIMS = tuple(
    Claim(id, title, tuple(experiments.split()), previous, earlier)
    for id, title, experiments, previous, earlier in (
        ("E1", "bilinear scores cannot rank an XOR-relevant key, additive can", "xor_relation",
         "supported", ""),
        ("E2", "one head cannot do XOR of two bits; two heads, an MLP or a LayerNorm can",
         "xor_bits", "inconclusive", "inconclusive"),
        ("E3", "one dot head cannot select argmax min(k₁, k₂); two heads + MLP can",
         "min_of_keys", "refuted", "inconclusive"),
        ("E4", "a large-norm impostor fools dot, not cosine or additive", "impostor", "supported",
         ""),
        ("E5", "MQA cannot realize two key orderings that MHA can; GQA in between (as worded: "
         "heads of size 2)", "mqa_ordering", "refuted", "supported"),
        ("E6", "two layers solve MQAR, one does not; flat in width 64-128 below the ceiling at "
         "600 steps (learning speed), 256 not run", "mqar", "inconclusive", "supported"),
        ("E7", "attention's path does not decay with distance; RNNs' does; CNN sees its field",
         "gradient_path copy", "supported", ""),
        ("S1", "unscaled logits' variance grows as H and softmax saturates", "dk_scaling",
         "supported", ""),
        ("S2", "unscaled dot degrades training as H grows, additive does not; scaling fixes it "
         "(judged within 400 steps, Adam and SGD)", "dk_scaling", "refuted", "inconclusive"),
        ("S3", "dot is at least as good as general (judged as Luong: LSTM states, unscaled dot, "
         "general from W = I)", "luong_scores", NEW, "refuted"),
        ("S4", "fixed-scale cosine caps the top weight; a learnable scale removes the cap "
         "(judged: learnable from g = 1)", "cosine_bound", NEW, "supported"),
        ("S5", "gradients vanish at both temperature extremes", "temperature", "supported", ""),
        ("S6", "QK-LayerNorm caps the max logit and lowers LR sensitivity", "qk_norm",
         "supported", ""),
        ("S7", "positional amplitude: too small → uniform, too large → collapse",
         "positional_amplitude", "supported", ""),
        ("S8", "additive: a bias keeps tanh active; ReLU dead units, a positive bias helps "
         "(judged: fewer dead units, no accuracy lost; cancellation a Check)", "activation",
         "inconclusive", "inconclusive"),
        ("S9", "low attention entropy accompanies loss spikes: collapsed runs spike more, near "
         "the collapse", "entropy_collapse", NEW, "supported"),
        ("M1", "degenerate inputs collapse heads; diversity penalties keep them apart",
         "head_diversity", "supported", ""),
        ("M2", "pruning heads: a plateau, then a cliff", "head_pruning", "supported", ""),
        ("M3", "at init the output norm is flat in h; the heads average with variance σ²/h",
         "head_init", NEW, ""),
        ("M4", "sharp heads average into a multimodal map (judged as does: a trained model)",
         "head_averaging", NEW, "supported"),
        ("A1", "one additive head solves every task one multiplicative head solves (at matched "
         "parameters, within each column's steps)", "atlas", NEW, ""),
        ("A2", "on the recall tasks every score ties with scaled_dot at two layers (±0.05; "
         "additive on mqar excepted)", "atlas", NEW, ""),
        ("A3", "cosine with a learnable scale matches scaled_dot (±0.05; impostor reported)",
         "atlas", NEW, ""),
    )
)  # fmt: skip
EXPERIMENTS = tuple(dict.fromkeys(e for c in CLAIMS for e in c.experiments))


@dataclasses.dataclass(frozen=True)
class Record:
    """An experiment's published record: ``verdicts`` and ``reasons`` by claim id, and the
    report's ``body`` (``report.md`` after its verdict lines)."""

    verdicts: dict[str, str]
    reasons: dict[str, str]
    body: str
    command: str


def read_record(folder: Path) -> Record | None:
    """The record in ``folder`` (``results/<experiment>``), or None if it has none."""
    if not (folder / "report.md").exists():
        return None
    lines = (folder / "report.md").read_text().splitlines()
    verdicts = {}
    while lines and (match := VERDICT_LINE.fullmatch(lines[0])):
        verdicts[match["claim"]] = match["verdict"]
        lines.pop(0)
    body = "\n".join(lines).strip() + "\n"
    reasons = {
        m["claim"]: m["reason"].strip()
        for m in re.finditer(r"\*\*Verdict \((?P<claim>[^)]+)\): \w+\.\*\* (?P<reason>.*)", body)
    }
    env = storage.read_json(folder / "env.json") if (folder / "env.json").exists() else {}
    return Record(verdicts, reasons, body, env.get("command", ""))


def blocks(root: Path, audit: bool = True) -> dict[str, str]:
    """Every generated block's content, from ``root/results/`` (``audit=False``: all but the
    audit's, which audits every record: minutes)."""
    records = {e: read_record(root / "results" / e) for e in EXPERIMENTS}
    out = {"summary": summary_block(records), "readme": readme_block(records)}
    if audit:
        out["audit"] = audit_table(audit_records(root))
    for name, record in records.items():
        out[f"results:{name}"] = results_block(name, record)
    return out


def _verdict(records: dict[str, Record | None], claim: Claim, experiment: str) -> str:
    record = records[experiment]
    if record is None:
        return f"not yet {'run' if claim.previous == NEW else 'rerun'} (no committed record)"
    return record.verdicts.get(claim.id, "not judged")


def summary_block(records: dict[str, Record | None]) -> str:
    rows = []
    for claim in CLAIMS:
        for e in claim.experiments:
            record = records[e]
            reason = record.reasons.get(claim.id, "").replace("|", "\\|") if record else ""
            rows.append([f"{claim.id} {claim.title}", f"[`{e}`](#{e})",
                         _verdict(records, claim, e), claim.earlier_design or "—",
                         claim.previous, reason])  # fmt: skip
    header = ["claim", "experiment", "verdict", "earlier design", "before records", "measured"]
    return markdown_table(header, rows)


def readme_block(records: dict[str, Record | None]) -> str:
    rows = [[f"{c.id} {c.title}", f"`{e}`", _verdict(records, c, e)]
            for c in CLAIMS for e in c.experiments]  # fmt: skip
    return markdown_table(["claim", "experiment", "verdict"], rows)


def results_block(name: str, record: Record | None) -> str:
    """The experiment's report, its headings two levels down and its links into
    ``results/<name>/``."""
    anchor = f'<a id="{name}"></a>\n\n'
    if record is None:
        command = f"attnjax sweep experiments/{name}.py --seeds 5 --publish"
        return f"{anchor}No committed record yet: `{command}`.\n"
    body = re.sub(r"^(#+) ", lambda m: "#" * (len(m[1]) + 2) + " ", record.body, flags=re.M)
    body = re.sub(r"\]\(([\w.-]+\.(?:png|csv))\)", rf"](../results/{name}/\1)", body)
    return anchor + (
        f"Record: [`results/{name}/`](../results/{name}/) (`results.csv`, `report.md`, "
        f"`env.json`); command: `{record.command}`.\n\n{body}"
    )


def rewrite(text: str, contents: dict[str, str], on_change: Callable[[str], None]) -> str:
    """``text`` with each known block's content replaced; ``on_change(name)`` per change."""

    def replace(m: re.Match) -> str:
        name = m["name"]
        if name not in contents:
            return m[0]
        if m["body"] != contents[name]:
            on_change(name)
        return m[1] + contents[name] + m[4]

    return BLOCK.sub(replace, text)


TARGETS = {  # file: the blocks it must hold
    "docs/claims.md": ("summary", "audit", *(f"results:{e}" for e in EXPERIMENTS)),
    "README.md": ("readme",),
}


def find_root(start: Path) -> Path | None:
    """The repository (the folder holding ``docs/claims.md`` and ``results/``) that holds
    ``start``, or None."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / "docs" / "claims.md").is_file() and (folder / "results").is_dir():
            return folder
    return None


def problems(root: Path) -> list[str]:
    """What no rewrite can fix: missing or unknown blocks, records that do not judge a claim
    their experiment is mapped to."""
    found = []
    for target, names in TARGETS.items():
        present = {m["name"] for m in BLOCK.finditer((root / target).read_text())}
        found += [f"{target}: {name} (missing)" for name in names if name not in present]
        found += [f"{target}: {name} (unknown block)" for name in sorted(present - set(names))]
    for claim in CLAIMS:
        for e in claim.experiments:
            record = read_record(root / "results" / e)
            if record is not None and claim.id not in record.verdicts:
                found.append(f"results/{e}/report.md: no verdict line for {claim.id}")
    return found


def update(root: Path, check: bool = False, audit: bool = True) -> list[str]:
    """Rewrite the generated blocks under ``root`` (``check``: only compare; ``audit=False``:
    leave the audit's block as it is); return the blocks that differed, as ``file: block``."""
    contents, changed = blocks(root, audit), []
    for target in TARGETS:
        path = root / target
        text = path.read_text()
        new = rewrite(text, contents, lambda name, t=target, c=changed: c.append(f"{t}: {name}"))
        if not check and new != text:
            path.write_text(new)
    return changed
