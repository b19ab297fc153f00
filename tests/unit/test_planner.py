"""The planner's traffic model against simulated batches, its profiles, and its choice."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from ember.trainer.config import TrainConfig
from ember.trainer.data.batch import Batch, JaggedIds
from ember.trainer.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig, zipf_ranks
from ember.trainer.plan.apply import applied, plan_for, workload_of
from ember.trainer.plan.planner import TIE_MARGIN, make_plan
from ember.trainer.plan.profile import (
    counted_profile,
    fit_zipf_exponent,
    zipf_probabilities,
    zipf_profile,
)
from ember.trainer.plan.step_model import CostLine, MachineFigures, step_time
from ember.trainer.plan.traffic_model import TrafficModel, Workload

FIGURES = MachineFigures(CostLine(0.05, 2e-6), CostLine(0.04, 1e-6), control_bytes_per_step=900)


def _batches(rng, cardinalities, exponent, batch, count):
    for _ in range(count):
        sparse = [
            JaggedIds(
                torch.from_numpy(zipf_ranks(rng, n, exponent, batch)),
                torch.arange(batch + 1, dtype=torch.int64),
            )
            for n in cardinalities
        ]
        yield Batch(torch.zeros(batch, 13), sparse, torch.zeros(batch))


def test_zipf_law_matches_the_generator():
    rng = np.random.default_rng(1)
    draws = zipf_ranks(rng, 1000, 1.2, 400_000)
    measured = np.bincount(draws, minlength=1000) / len(draws)
    law = zipf_probabilities(1000, 1.2)
    assert law.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(measured[:20], law[:20], rtol=0.05)
    assert fit_zipf_exponent(np.sort(np.bincount(draws))[::-1], 1000) == pytest.approx(
        1.2, abs=0.05
    )


@pytest.mark.parametrize("hot_rows", [0, 40, 400])
def test_predicted_rows_match_a_simulation(hot_rows):
    """Distinct, cold and collision rows per step against batches drawn from the law."""
    cardinalities, batch = (3000, 200), 512
    profiles = [zipf_profile(f"t{i}", n, 1.1) for i, n in enumerate(cardinalities)]
    model = TrafficModel(profiles, Workload(dim=8, batch_size=batch))
    predicted = model.traffic(hot_rows, staleness=0)
    order = np.argsort(-np.concatenate([p.probabilities for p in profiles]), kind="stable")
    owner = np.concatenate([np.full(n, i) for i, n in enumerate(cardinalities)])[order]
    local = np.concatenate([np.arange(n) for n in cardinalities])[order]
    hot = [set(local[:hot_rows][owner[:hot_rows] == i]) for i in range(len(cardinalities))]
    rng = np.random.default_rng(7)
    distinct, cold, collisions, previous = [], [], [], None
    for step in _batches(rng, cardinalities, 1.1, batch, 300):
        cold_sets = [set(f.values.tolist()) - hot[i] for i, f in enumerate(step.sparse)]
        distinct.append(sum(len(set(f.values.tolist())) for f in step.sparse))
        cold.append(sum(map(len, cold_sets)))
        if previous is not None:
            collisions.append(sum(len(a & b) for a, b in zip(cold_sets, previous)))
        previous = cold_sets
    assert predicted.distinct_rows == pytest.approx(np.mean(distinct), rel=0.02)
    assert predicted.cold_rows == pytest.approx(np.mean(cold), rel=0.02)
    assert predicted.collision_rows == pytest.approx(np.mean(collisions), rel=0.05)
    assert model.traffic(hot_rows, staleness=1).collision_rows == 0


def test_counted_profile_predicts_fresh_batches():
    """Good-Turing: the hit rate of a hot set picked from a sample, on batches not in it
    (raw counts would overrate the ids the sample happened to see once)."""
    cardinalities, batch = (20_000, 5000), 256
    rng = np.random.default_rng(3)
    profiles = counted_profile(
        _batches(rng, cardinalities, 1.2, batch, 16), ["a", "b"], cardinalities
    )
    model = TrafficModel(profiles, Workload(dim=8, batch_size=batch))
    counts = np.concatenate([p.rank_key for p in profiles])
    hot_rows = int((counts >= 1).sum())  # every id the sample saw, the once-seen ones too
    predicted = model.traffic(hot_rows, staleness=1)
    sample = list(_batches(np.random.default_rng(3), cardinalities, 1.2, batch, 16))
    seen = [set(torch.cat([b.sparse[i].values for b in sample]).tolist()) for i in range(2)]
    fresh = list(_batches(np.random.default_rng(99), cardinalities, 1.2, batch, 100))
    hits = sum(len(set(b.sparse[i].values.tolist()) & seen[i]) for b in fresh for i in range(2))
    total = sum(len(set(b.sparse[i].values.tolist())) for b in fresh for i in range(2))
    assert predicted.hit_rate == pytest.approx(hits / total, rel=0.05)


def test_profile_that_does_not_match_the_tables_is_refused():
    batches = list(_batches(np.random.default_rng(0), (10, 10), 1.2, 8, 2))
    with pytest.raises(ValueError, match="3 features but 2 cardinalities"):
        counted_profile(batches, ["a", "b", "c"], [10, 10])
    with pytest.raises(ValueError, match="names 3 features, a batch has 2"):
        counted_profile(batches, ["a", "b", "c"], [10, 10, 10])
    with pytest.raises(ValueError, match="no batch"):
        counted_profile([], ["a"], [10])


def test_step_time_bounds():
    model = TrafficModel([zipf_profile("t", 5000, 1.1)], Workload(dim=16, batch_size=1024))
    traffic = model.traffic(0, staleness=1)
    assert step_time(traffic, 1, FIGURES).seconds == pytest.approx(0.04 + 1e-6 * traffic.cold_rows)
    slow = FIGURES.on_link(2.0, rtt_ms=2)
    link = max(traffic.bytes_up, traffic.bytes_down) * 8 / 2e6 + 0.002
    assert step_time(traffic, 4, slow).seconds == pytest.approx(link)  # staleness hides the chain
    assert step_time(traffic, 4, slow).bound == "link"
    # CPU and link about equal: the update-then-parked-lookup chain sets the pace
    both_ways = (traffic.bytes_up + traffic.bytes_down) * 8 / 2e6
    even = dataclasses.replace(FIGURES, cpu_stale=CostLine(link, 0.0)).on_link(2.0, rtt_ms=2)
    for staleness in (1, 2, 3):
        chained = step_time(traffic, staleness, even)
        assert chained.seconds == pytest.approx(
            max(link, (link + both_ways + 0.002) / (staleness + 1))
        )
    assert step_time(traffic, 1, even).bound == "chain"
    # Only the compute that needs a step's rows lies on the chain, where it is calibrated.
    on_chain = dataclasses.replace(even, cpu_chain=CostLine(link / 2, 0.0))
    assert step_time(traffic, 1, on_chain).chain_s == pytest.approx(
        (link / 2 + both_ways + 0.002) / 2
    )
    assert MachineFigures.from_json(on_chain.to_json()) == on_chain
    exact = model.traffic(0, staleness=0)
    assert step_time(exact, 0, slow).seconds > step_time(exact, 0, FIGURES).seconds + 0.002


def test_cost_line_fit():
    line = CostLine.fit([100, 2000, 5000], [0.1 + 3e-6 * x for x in (100, 2000, 5000)])
    assert (line.base_s, line.per_cold_row_s) == (pytest.approx(0.1), pytest.approx(3e-6))
    assert CostLine.fit([100, 200], [0.2, 0.1]).per_cold_row_s == 0.0  # noise, not a speed-up


def test_plan_chooses_the_fastest_or_a_near_tie_with_fewer_bytes_within_budget_and_cap():
    model = TrafficModel([zipf_profile("t", 50_000, 1.1)], Workload(dim=16, batch_size=1024))
    budget = 2 * 2**20
    strict = make_plan(model, FIGURES.on_link(25.0), budget, max_staleness=2, tie_margin=0)
    fastest = max(c.samples_per_s for c in strict.candidates)
    assert strict.choice.samples_per_s == fastest
    assert strict.choice.staleness == 1  # s=2 predicts the same: the smaller wins
    # Within the margin of the fastest, the fewest bytes: the surest prediction decides.
    plan = make_plan(model, FIGURES.on_link(25.0), budget, max_staleness=2)
    near = [
        c for c in plan.candidates
        if c.samples_per_s >= (1 - TIE_MARGIN) * fastest and c.staleness == 1
    ]  # fmt: skip
    assert len(near) > 1 and plan.choice == min(near, key=lambda c: c.bytes_per_step(1024))
    assert plan.choice.bytes_per_step(1024) < strict.choice.bytes_per_step(1024)
    assert plan.choice.staleness == 1
    # Without a link in the figures there is nothing to hedge: the fastest.
    fast_network = make_plan(model, FIGURES, budget, max_staleness=2)
    assert fast_network.choice.samples_per_s == max(
        c.samples_per_s for c in fast_network.candidates
    )
    assert fast_network.choice.staleness == 1
    # ... even where an exact (s = 0) candidate is within the margin.
    close = MachineFigures(CostLine(0.0405, 1e-6), CostLine(0.04, 1e-6))
    closest = make_plan(model, close, budget, max_staleness=1)
    exact_best = max(c.samples_per_s for c in closest.candidates if c.staleness == 0)
    assert exact_best >= (1 - TIE_MARGIN) * closest.choice.samples_per_s
    assert closest.choice.staleness == 1
    assert closest.choice.samples_per_s == max(c.samples_per_s for c in closest.candidates)
    assert plan.choice.hot_rows * model.workload.hot_row_bytes <= budget
    assert all(c.staleness <= 2 for c in plan.candidates)
    exact = make_plan(model, FIGURES.on_link(25.0), budget, max_staleness=0)
    assert exact.choice.staleness == 0
    document = json.loads(json.dumps(plan.to_json()))
    assert document["choice"]["hot_rows"] == plan.choice.hot_rows
    assert document["predicted_gain"] == pytest.approx(
        plan.choice.samples_per_s / plan.baseline.samples_per_s
    )
    assert document["predicted_gain"] > 1


def test_near_ties_never_choose_a_plan_slower_than_no_hot_set():
    # Write-backs make every hot set slower than none; some are within the margin and move
    # fewer bytes, but a plan slower than its own baseline is not taken.
    model = TrafficModel(
        [zipf_profile("t", 50_000, 1.1)],
        Workload(dim=16, batch_size=1024, steps=20, state_floats=16),
    )
    figures = MachineFigures(
        CostLine(0.05, 0.0), CostLine(0.05, 0.0), bandwidth_mbit=1000, writeback_s_per_row=1e-4
    )
    plan = make_plan(model, figures, 2**20, max_staleness=0)
    assert plan.choice.hot_rows == 0 and plan.predicted_gain == pytest.approx(1.0)
    assert any(
        c.hot_rows and c.samples_per_s >= (1 - TIE_MARGIN) * plan.baseline.samples_per_s
        and c.bytes_per_step(1024) < plan.baseline.bytes_per_step(1024)
        for c in plan.candidates
    )  # fmt: skip
    document = plan.to_json()
    assert document["tie_margin"] == TIE_MARGIN
    assert document["fastest_samples_per_s"] == pytest.approx(plan.baseline.samples_per_s)


def test_plan_refuses_a_tie_margin_outside_0_to_1():
    model = TrafficModel([zipf_profile("t", 100, 1.1)], Workload(dim=16, batch_size=8))
    for margin in (-0.1, 1.0):
        with pytest.raises(ValueError, match="tie margin"):
            make_plan(model, FIGURES, 2**20, 1, tie_margin=margin)


def test_plan_refuses_a_budget_below_one_row():
    model = TrafficModel([zipf_profile("t", 100, 1.1)], Workload(dim=16, batch_size=8))
    with pytest.raises(ValueError, match="holds no hot row"):
        make_plan(model, FIGURES, model.workload.hot_row_bytes - 1, 1)


def _small_config(**change):
    settings = {
        "endpoints": ("unused:0",), "batch_size": 64, "max_cardinality": 2000,
        "profile_batches": 4, "cache": "replicated", "cache_mb": 0.5, "staleness": 1,
    }  # fmt: skip
    return TrainConfig(**{**settings, **change})


def _data(config):
    return SyntheticCriteo(SyntheticCriteoConfig(cardinalities=(2000, 300), seed=config.seed))


def test_plan_file_applies_to_its_workload_only(tmp_path):
    from ember.trainer.cache.profiler import profile_hot_ids
    from ember.trainer.plan.apply import workload_profiles
    from ember.trainer.sources import hot_row_bytes, profile_batches

    config = _small_config(cache_mb=0.01)
    data, names = _data(config), ["a", "b"]
    plan = plan_for(config, workload_profiles(config, data, names, 1), FIGURES, 1)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan.to_json(), "workload": workload_of(config, 1)}))
    planned = applied(_small_config(cache_mb=0.01, plan=str(path)), data, names, 1)
    assert (planned.cache, planned.staleness) == ("replicated", plan.choice.staleness)
    # The trainer's profiler keeps exactly the planned number of hot rows, fewer than seen.
    assert (
        0
        < plan.choice.hot_rows
        < TrafficModel(
            workload_profiles(config, data, names, 1), Workload(dim=16, batch_size=64)
        ).profiled_rows
    )
    sample = profile_batches(planned, data, 0, 1)
    budget = int(planned.cache_mb * 2**20)
    hot = profile_hot_ids(sample, names, budget, hot_row_bytes(planned))
    assert sum(len(ids) for ids in hot.values()) == plan.choice.hot_rows
    with pytest.raises(ValueError, match="batch_size differ"):
        applied(_small_config(cache_mb=0.01, plan=str(path), batch_size=128), data, names, 1)
    with pytest.raises(ValueError, match="cannot read the plan file"):
        applied(_small_config(plan=str(tmp_path / "missing.json")), data, names, 1)


def test_plan_auto_needs_figures(tmp_path):
    config = _small_config(plan="auto")
    with pytest.raises(ValueError, match="--plan-figures"):
        applied(config, _data(config), ["a", "b"], 1)
    figures = tmp_path / "figures.json"
    figures.write_text(json.dumps({"figures": FIGURES.to_json()}))
    planned = applied(
        _small_config(plan="auto", plan_figures=str(figures)), _data(config), ["a", "b"], 1
    )
    from ember.trainer.plan.apply import workload_profiles

    auto = _small_config(plan="auto", plan_figures=str(figures))
    expected = plan_for(auto, workload_profiles(auto, _data(config), ["a", "b"], 1), FIGURES, 1)
    assert planned.plan == "" and planned.staleness == expected.choice.staleness
    assert planned.cache == ("replicated" if expected.choice.hot_rows else "none")
    assert planned.cache_mb == pytest.approx(expected.choice.cache_mb(expected.hot_row_bytes))
    figures.write_text(json.dumps({"figures": {"cpu_exact": {"base_s": 1}}}))
    with pytest.raises(ValueError, match="malformed"):
        applied(_small_config(plan="auto", plan_figures=str(figures)), _data(config), ["a", "b"], 1)


def test_several_ranks_collisions_and_hot_allreduce_match_a_simulation():
    """Two ranks: a row of my next step collides when either rank's step updated it, and the
    hot rows' gradients all-reduced are the union both ranks touched."""
    cardinality, batch, hot_rows, world = 2000, 256, 50, 2
    model = TrafficModel(
        [zipf_profile("t", cardinality, 1.1)], Workload(dim=8, batch_size=batch, ranks=world)
    )
    predicted = model.traffic(hot_rows, staleness=0)
    rng = np.random.default_rng(11)
    collisions, union = [], []
    previous_all = None
    for _ in range(300):
        ranks = [set(zipf_ranks(rng, cardinality, 1.1, batch).tolist()) for _ in range(world)]
        hot = set(range(hot_rows))
        union.append(len(set().union(*ranks) & hot))
        if previous_all is not None:
            collisions.append(len((ranks[0] - hot) & previous_all))
        previous_all = set().union(*ranks) - hot
    assert predicted.collision_rows == pytest.approx(np.mean(collisions), rel=0.05)
    expected_allreduce = hot_rows + 1 + 4 * 8 * np.mean(union)
    assert predicted.bytes_hot_allreduce == pytest.approx(expected_allreduce, rel=0.03)
    one_rank = TrafficModel(
        [zipf_profile("t", cardinality, 1.1)], Workload(dim=8, batch_size=batch)
    )
    assert one_rank.traffic(hot_rows, 0).bytes_hot_allreduce == 0
    slow = FIGURES.on_link(1.0)
    with_ranks = step_time(predicted, 0, slow, ranks=world).seconds
    assert with_ranks - step_time(predicted, 0, slow).seconds == pytest.approx(
        predicted.bytes_hot_allreduce * 8 / 1e6
    )  # a ring moves 2 (W-1)/W of the bytes: all of them for 2 ranks


def test_async_updates_plan_with_staleness_one_or_more():
    model = TrafficModel([zipf_profile("t", 5000, 1.1)], Workload(dim=16, batch_size=256))
    plan = make_plan(model, FIGURES, 2**20, max_staleness=2, min_staleness=1)
    assert min(c.staleness for c in plan.candidates) == 1
    assert plan.baseline.staleness == 1
    with pytest.raises(ValueError, match="staleness range 1..0"):
        make_plan(model, FIGURES, 2**20, max_staleness=0, min_staleness=1)


def test_figures_that_predict_no_time_are_refused():
    with pytest.raises(ValueError, match="not both 0"):
        MachineFigures(CostLine(0.0, 0.0), CostLine(0.01, 0.0))
    with pytest.raises(ValueError, match="control_bytes_per_step"):
        MachineFigures(CostLine(0.01, 0.0), CostLine(0.01, 0.0), control_bytes_per_step=-1)
    with pytest.raises(ValueError, match="bandwidth_mbit must be > 0"):
        FIGURES.on_link(0.0)


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ({"hot_rows": -1, "cache_mb": 0.1, "staleness": 1}, "out of range"),
        ({"hot_rows": 10, "cache_mb": 0.1, "staleness": 1}, "does not hold exactly"),
        ({"hot_rows": 10, "cache_mb": "inf", "staleness": 1}, "does not hold exactly"),
        ({"hot_rows": 10, "staleness": 1}, "no valid choice"),
        ({"hot_rows": 0, "cache_mb": 0, "staleness": 99}, "out of range"),
        ({"hot_rows": 10.7, "cache_mb": 0.1, "staleness": 1}, "must be integers"),
        ({"hot_rows": 10, "cache_mb": 0.1, "staleness": True}, "must be integers"),
    ],
)
def test_a_plan_file_with_a_bad_choice_is_refused(tmp_path, choice, message):
    config = _small_config()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"choice": choice, "workload": workload_of(config, 1)}))
    with pytest.raises(ValueError, match=message):
        applied(_small_config(plan=str(path)), _data(config), ["a", "b"], 1)


def test_writeback_is_the_hot_rows_drawn_between_write_backs_amortised():
    profile = zipf_profile("t", 3000, 1.1)
    every_step = TrafficModel(
        [profile], Workload(dim=8, batch_size=256, steps=10, flush_every=1)
    ).traffic(100, staleness=1)
    hot = every_step.distinct_rows - every_step.cold_rows
    assert every_step.writeback_rows == pytest.approx(hot)
    assert every_step.bytes_writeback == pytest.approx(hot * (8 + 4 * 8 + 8))
    at_the_end = TrafficModel(
        [profile], Workload(dim=8, batch_size=256, state_floats=8, steps=50)
    ).traffic(100, staleness=1)
    assert at_the_end.writeback_rows < every_step.writeback_rows / 10  # hot rows repeat
    assert at_the_end.writeback_rows * 50 <= 100  # at most every hot row, once
    assert at_the_end.bytes_writeback == pytest.approx(at_the_end.writeback_rows * (8 + 64 + 8))
    # 25 steps with a write-back every 10: two of 10 steps and the last of 5.
    assert Workload(dim=8, batch_size=1, steps=25, flush_every=10).writeback_intervals == [
        10, 10, 5,
    ]  # fmt: skip


def test_good_turing_keeps_count_order_and_the_head_as_counted():
    """Counts 10, 6, 6, 5, 1, 1, 1 of a table with 20 ids: the frequent ids keep r / N, no
    rarer id outweighs a commoner one, the once-seen mass goes to the 13 unseen ids."""
    batch_ids = [0] * 10 + [1] * 6 + [2] * 6 + [3] * 5 + [4, 5, 6]
    batch = Batch(
        torch.zeros(len(batch_ids), 13),
        [JaggedIds(torch.tensor(batch_ids), torch.arange(len(batch_ids) + 1))],
        torch.zeros(len(batch_ids)),
    )
    (profile,) = counted_profile([batch], ["t"], [20])
    total = len(batch_ids)
    assert profile.probabilities[:3].tolist() == pytest.approx([10 / total, 6 / total, 6 / total])
    assert bool((np.diff(profile.probabilities) <= 1e-12).all())
    assert profile.unseen_ids == 13
    assert profile.unseen_ids * profile.unseen_probability == pytest.approx(3 / total)
    profile.validate()  # sums to 1
