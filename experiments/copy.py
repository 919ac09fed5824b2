"""CLAIMS E7: attention gives every output an O(1) path to every input, so copy accuracy
stays flat as the copy distance grows; a GRU's or LSTM's path grows with the distance and its
accuracy decays; a causal CNN sees only its receptive field (4 layers, kernel 3, dilations
1-8; the field is computed from the model config), so it fails at distances beyond it."""

from pathlib import Path

from attnjax.experiment import Experiment, Summary, grid, label, load_file, with_overrides

_CONFIG = Path(__file__).parents[1] / "configs" / "copy.py"
SOLVED, CHANCE = 0.9, 1 / 8
DISTANCES = [12, 24, 48]
MODELS = (
    {"model.kind": "transformer"},
    {"model.kind": "rnn", "model.cell": "gru"},
    {"model.kind": "rnn", "model.cell": "lstm"},
    {"model.kind": "cnn", "model.layers": 4},
)


def verdict(summary: Summary, receptive_field: int) -> tuple[str, str]:
    """Supported iff attention reaches ``SOLVED`` (mean) at every distance; for GRU and LSTM
    the interval at the largest distance lies below both their own at the smallest distance
    and attention's at the largest; and the CNN beyond its receptive field stays within 0.1
    of chance (upper end). Refuted iff a GRU or LSTM interval at the largest distance lies
    at or above attention's. Otherwise inconclusive."""

    def at(model: dict, distance: int):
        return summary[model | {"task.distance": distance}]

    near, far = DISTANCES[0], DISTANCES[-1]
    attention = [at(MODELS[0], d) for d in DISTANCES]
    rnns = MODELS[1:3]
    cnn_far = [at(MODELS[3], d) for d in DISTANCES if d >= receptive_field]
    detail = (
        "; ".join(
            f"{label(m)}: " + ", ".join(f"{at(m, d).mean:.3f}" for d in DISTANCES) for m in MODELS
        )
        + f" (distances {DISTANCES}; CNN receptive field {receptive_field})."
    )
    if any(at(m, far).lower >= attention[-1].upper for m in rnns):
        return "refuted", detail
    flat = all(s.mean >= SOLVED for s in attention)
    decays = all(at(m, far).upper < min(at(m, near).lower, attention[-1].lower) for m in rnns)
    if flat and decays and all(s.upper <= CHANCE + 0.1 for s in cnn_far):
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    field = with_overrides(base, MODELS[3]).model.receptive_field
    return Experiment(
        name="copy",
        claim_id="E7",
        claim=" ".join(__doc__.split()),
        base=base,
        points=tuple(m | d for m in MODELS for d in grid(**{"task.distance": DISTANCES})),
        metric="accuracy",
        verdict=lambda summary: verdict(summary, field),
        learning_rates=(1e-3, 3e-3, 1e-2),
        solved_at=SOLVED,
    )
