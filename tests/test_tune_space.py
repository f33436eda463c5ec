"""The space inside real Optuna and real Ray Tune: samples are coupled recipes."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest

from raybatch import SearchSpace, TrialConfig, keys, load_space
from raybatch.space.tune_space import (
    DERIVED_KEYS,
    RECORDED_PER_TRIAL,
    STUDY_SPACE_ATTR,
    optuna_space,
    tune_param_space,
)

from .conftest import minimal_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _assert_consistent(space: SearchSpace, config: dict[str, Any]) -> None:
    """A trial's config carries the derived keys, and they match its raw knobs."""
    assert set(DERIVED_KEYS) <= set(config)
    derived = space.derive_from(config)
    assert TrialConfig.from_dict(config) == derived


def test_define_by_run_searches_only_raw_knobs_and_records_derived_values(tmp_path: Path) -> None:
    space = load_space("deit_vit_adamw")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    fn = optuna_space(space)
    for _ in range(8):
        trial = study.ask()
        constants = fn(trial)
        config = {**trial.params, **constants}
        _assert_consistent(space, config)
        assert set(trial.params) == set(keys.RAW_KNOBS)
        assert not set(trial.params) & set(constants)
        study.tell(trial, float(config[keys.EFFECTIVE_BATCH_SIZE]))
    # Optuna's storage (what optuna-dashboard reads) holds the derived recipe.
    reloaded = optuna.load_study(
        study_name=study.study_name, storage=f"sqlite:///{tmp_path / 'optuna.db'}"
    )
    stored_space = SearchSpace.from_dict(reloaded.user_attrs[STUDY_SPACE_ATTR])
    assert stored_space.model_dump() == space.model_dump()
    for t in reloaded.trials:
        derived = stored_space.derive(**{k: t.params[k] for k in keys.RAW_KNOBS}).to_dict()
        assert {k: t.user_attrs[k] for k in RECORDED_PER_TRIAL} == {
            k: pytest.approx(derived[k]) for k in RECORDED_PER_TRIAL
        }


def test_single_choice_knobs_are_constants_not_parameters() -> None:
    space = SearchSpace.from_dict(minimal_space())  # world_size [1], no multipliers
    study = optuna.create_study()
    trial = study.ask()
    constants = optuna_space(space)(trial)
    assert set(trial.params) == {keys.MICRO_BATCH_SIZE, keys.ACCUMULATION_STEPS}
    assert constants[keys.WORLD_SIZE] == 1
    assert constants[keys.LR_MULTIPLIER] == 1.0


def test_define_by_run_survives_pickle_as_ray_checkpoints_it() -> None:
    fn = optuna_space(load_space("digits_cnn_sgd"))
    clone = pickle.loads(pickle.dumps(fn))
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    assert clone(trial)[keys.SPACE] == "digits_cnn_sgd"


def _trivial_trainable(config: dict[str, Any]) -> dict[str, Any]:
    # A stand-in objective: pretend larger effective batches finish sooner.
    return {
        "score": 1000.0 / config[keys.EFFECTIVE_BATCH_SIZE] + config[keys.LR],
        "config_seen": dict(config),
    }


@pytest.mark.slow
def test_optuna_search_in_a_real_tuner_gives_every_trial_a_consistent_recipe(
    ray_session: None, tmp_path: Path
) -> None:
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    space = load_space("digits_cnn_sgd")
    searcher = OptunaSearch(
        space=optuna_space(space),
        metric="score",
        mode="min",
        sampler=optuna.samplers.TPESampler(seed=1, multivariate=True),
    )
    tuner = tune.Tuner(
        _trivial_trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=5, max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="space", verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 5
    assert results.num_errors == 0
    for result in results:
        _assert_consistent(space, result.config)
        assert result.metrics["config_seen"] == result.config
        assert result.config[keys.MICRO_BATCH_SIZE] in space.search.micro_batch_size
    study_trials = searcher._ot_study.trials
    assert len(study_trials) == 5
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study_trials)


@pytest.mark.slow
def test_plain_tune_param_space_derives_recipes_under_random_search(
    ray_session: None, tmp_path: Path
) -> None:
    from ray import tune

    space = load_space("bert_finetune_adamw")
    tuner = tune.Tuner(
        _trivial_trainable,
        param_space=tune_param_space(space),
        tune_config=tune.TuneConfig(num_samples=4, metric="score", mode="min"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="random", verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 4
    assert results.num_errors == 0
    for result in results:
        _assert_consistent(space, result.config)
        mult = result.config[keys.LR_MULTIPLIER]
        assert space.search.lr_multiplier is not None
        assert space.search.lr_multiplier.low <= mult <= space.search.lr_multiplier.high
