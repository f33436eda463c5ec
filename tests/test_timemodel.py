"""The time model: the noise-scale estimator on gradients of known statistics, predictions,
and the measurement on a real workload."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import raybatch
from raybatch.timemodel.model import NoiseScale, TimeModel, noise_scale, spearman


def _norms(g: torch.Tensor, sigma: float, small: int, big: int, batches: int, seed: int
           ) -> tuple[list[float], list[float]]:  # fmt: skip
    """Squared norms of mean gradients whose per-sample noise has covariance sigma^2 I."""
    gen = torch.Generator().manual_seed(seed)
    small_sq, big_sq = [], []
    k = big // small
    for _ in range(batches):
        per_sample = g + sigma * torch.randn(big, g.numel(), generator=gen)
        parts = per_sample.view(k, small, -1).mean(dim=1)
        small_sq.append(float((parts**2).sum(dim=1).mean()))
        big_sq.append(float((per_sample.mean(dim=0) ** 2).sum()))
    return small_sq, big_sq


def test_the_estimator_recovers_a_known_noise_scale_within_its_spread() -> None:
    """B_simple = tr(Sigma) / |G|^2 = 200 x 0.5^2 / 0.25 = 200 (McCandlish, appendix A)."""
    g = torch.full((200,), 0.5 / math.sqrt(200) * math.sqrt(0.25 * 4))  # |G|^2 = 0.25
    g = g * (0.5 / float(g.norm()))
    small_sq, big_sq = _norms(g, 0.5, 16, 128, 200, seed=0)
    measured = noise_scale(small_sq, big_sq, 16, 128)
    assert measured.low <= measured.b_simple <= measured.high
    assert measured.low < 200 < measured.high
    assert measured.b_simple == pytest.approx(200, rel=0.25)
    assert measured.batches == 200


def test_the_estimator_refuses_what_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="must exceed"):
        noise_scale([1.0, 1.0], [0.5, 0.5], 16, 16)
    with pytest.raises(ValueError, match=">= 2"):
        noise_scale([1.0], [0.5], 16, 128)


def test_the_model_trades_steps_for_step_time() -> None:
    """With B_noise = 256 and a step time that doubles with the batch past 64, the model's
    fastest effective batch sits between the two pulls, not at either end."""
    space = raybatch.load_space("tabular_mlp_adamw")
    micro_s = {m: 1e-3 * max(1.0, m / 64) for m in space.search.micro_batch_size}
    model = TimeModel(NoiseScale(256.0, 200.0, 300.0, 16, 128, 40), micro_s, 0.0)
    grid = [space.derive(m) for m in space.search.micro_batch_size]
    best = model.best_effective_batch(grid)
    assert 64 <= best <= 256
    assert model.predicted_time(space.derive(1024)) > model.predicted_time(space.derive(best))
    assert model.predicted_time(space.derive(16)) > model.predicted_time(space.derive(best))
    # Accumulation pays each micro step's fixed floor: 16 x 4 is slower than 64 x 1.
    assert model.predicted_time(space.derive(16, 4)) > model.predicted_time(space.derive(64))
    # A micro batch not timed is interpolated between its neighbours.
    assert micro_s[64] < model.micro_time(96) < micro_s[128]


def test_spearman_matches_scipy() -> None:
    from scipy.stats import spearmanr

    a, b = [1.0, 2.0, 3.0, 4.0, 5.0, 5.0], [2.0, 1.0, 4.0, 3.0, 6.0, 5.0]
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert spearman([1.0, 2.0], [1.0, 2.0]) is None


def test_a_trial_asked_for_the_time_model_measures_it_at_the_target_off_its_clock() -> None:
    """A real trial (tabular, through the trial wrapper as Tune runs it) asked to measure the
    model does so once it reaches the target: its final report carries a usable model (the
    noise scale, the step time of every micro batch up to its own), the measurement counts in
    the seconds the trial held its device but not in its training time or time to target."""
    import json

    from raybatch import Target, keys
    from raybatch.examples.tabular import TabularWorkload
    from raybatch.trial.settings import TrialSettings
    from raybatch.trial.wrapper import run_trial

    space = raybatch.load_space("tabular_mlp_adamw")
    reports: list[dict[str, Any]] = []
    config = {keys.MICRO_BATCH_SIZE: 64, keys.ACCUMULATION_STEPS: 2,
              keys.MEASURE_TIME_MODEL: True}  # fmt: skip
    # A fixed grid of sample marks: the model is measured where the trial reached, and with
    # the default training-time marks (read on the host clock) that point, and the noise
    # scale's interval there, moved with the machine's speed (its upper end was unbounded on
    # a fresh clone's run).
    settings = TrialSettings(Target(0.8), max_time_s=60.0, eval_every_samples=1024)
    run_trial(TabularWorkload(), space, settings, config, report_fn=reports.append)
    final = reports[-1]
    assert final[keys.STATUS] == "reached", final[keys.REASON]
    model = TimeModel.from_dict(json.loads(final[keys.TIME_MODEL]))
    noise = model.noise
    assert 0 < noise.low <= noise.b_simple <= noise.high < math.inf
    assert (noise.small_batch, noise.big_batch, noise.batches) == (16, 128, 16)
    assert sorted(model.micro_step_s) == [16, 32, 64]
    assert all(t > 0 for t in model.micro_step_s.values()) and model.optimizer_step_s > 0
    assert final[keys.EVAL_S] >= model.cost_s > 0  # off the training clock...
    assert final[keys.TIME_TO_TARGET_S] <= final[keys.TRAIN_S] < final[keys.ELAPSED_S]
    assert final[keys.HELD_S] >= final[keys.ELAPSED_S]  # ... on the device's
    # Not asked: no measurement.
    reports.clear()
    run_trial(TabularWorkload(), space, settings, {keys.MICRO_BATCH_SIZE: 64}, reports.append)
    assert reports[-1][keys.STATUS] == "reached" and keys.TIME_MODEL not in reports[-1]


def test_the_time_models_ranking_is_said_only_when_it_means_something() -> None:
    """Three reached trials give a rank correlation one of four values (one swap reads -0.5),
    and times within the run-to-run noise have no order to agree with: then the note says why
    nothing is said, never a figure."""
    from raybatch.timemodel.prediction import ranking_note

    assert ranking_note(-0.5, [1.0, 1.5, 2.0]) == (
        "too few trials reached the target (3) to say how well the time model ranked them"
    )
    tight = ranking_note(0.1, [1.0, 1.05, 1.1, 1.02, 1.08])
    assert tight is not None and "within 10% of each other" in tight and "0.1" not in tight
    said = ranking_note(0.8, [1.0, 1.5, 2.0, 3.0, 4.0])
    assert said == ("the time model ranked the 5 trials that reached the target with Spearman"
                    " 0.80 against their measured times")  # fmt: skip
    # A weak or reversed ranking is said to be one, not left as a bare figure.
    weak = ranking_note(0.16, [1.0, 1.5, 2.0, 3.0, 4.0])
    assert weak is not None and weak.endswith(
        "weak, its order little better than chance on this task"
    )
    reversed_ = ranking_note(-0.79, [1.0, 1.5, 2.0, 3.0, 4.0])
    assert reversed_ is not None and "the reverse of what was measured" in reversed_
    assert ranking_note(None, [2.0]) is None


def test_a_trial_sharing_its_gpu_says_why_it_measures_no_time_model() -> None:
    """Packed, its step times are its neighbours' too: asked for the model, it reports why it
    measured none (the plan logs it; the trials after it are asked too), never a model from
    shared steps."""
    from raybatch import keys
    from raybatch.examples.tabular import TabularWorkload
    from raybatch.timemodel.measure import PACKED, at_target_measure

    space = raybatch.load_space("tabular_mlp_adamw")
    recipe = space.derive(64)
    asked = {keys.MICRO_BATCH_SIZE: 64, keys.MEASURE_TIME_MODEL: True}
    cpu = torch.device("cpu")
    measure = at_target_measure(TabularWorkload(), space, recipe, cpu, asked, lambda: 0.01,
                                packed=True)  # fmt: skip
    assert measure is not None and measure(None, None, None) == {keys.TIME_MODEL_ERROR: PACKED}
    assert at_target_measure(TabularWorkload(), space, recipe, cpu, {}, lambda: 0.01) is None
