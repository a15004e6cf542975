"""TransferPolicy (pure): seed repeats, width ladder, top-k targets, transfer check, fidelity escalation, fallback
targets."""
import math

import pytest
from scipy.stats import spearmanr

from schedulers.transfer import (ONE_SIDED_95, Disagreement, RungKind, Score, TransferPolicy, rho_upper_bound,
                                 scores_of, spearman)


def policy(**kwargs):
    return TransferPolicy(**{"fraction": 1.0, "num_samples": 24, "metric": "acc", "mode": "max", **kwargs})


def run_stages(p, search, quality):
    """Drive ``p`` from the search's scores, scoring a config at each scale with ``quality(config, scale)``;
    returns the rungs trained and the scores of every stage."""
    stages, rungs = [search], []
    while (rung := p.next_rung(stages)) is not None:
        rungs.append(rung)
        stages.append(scores_of((c, quality(c, rung.scale)) for c in rung.configs for _ in range(rung.seeds)))
    return rungs, stages


def test_seed_repeats_are_reported_with_their_spread():
    scores = scores_of([("a", 0.80), ("b", 0.70), ("a", 0.84), ("a", 0.82), ("b", math.nan), ("c", math.inf)])
    assert list(scores) == ["a", "b"]  # c has no finite value
    assert scores["a"].mean == pytest.approx(0.82) and scores["a"].count == 3
    assert scores["a"].spread == pytest.approx(0.02)  # sample standard deviation
    assert scores["b"] == Score(0.70, 0.0, 1)
    assert str(scores["a"]) == "0.82 ± 0.02 (n=3)" and str(scores["b"]) == "0.7"


def test_width_ladder_promotes_the_best_members_and_ends_at_full_size():
    p = policy(scale=8, ladder=True, eta=3, top_k=2, seeds=2, escalate=False)  # the ladder alone
    search = scores_of((f"c{i:02d}", i / 100) for i in range(24))  # c23 best at S=8

    def quality(config, scale):  # at S=4 and below the ranking reverses among what is left
        return -int(config[1:]) / 100 if scale < 8 else int(config[1:]) / 100

    rungs, stages = run_stages(p, search, quality)
    assert [(r.scale, len(r.configs), r.seeds) for r in rungs] == [(4, 8, 2), (2, 3, 2), (1, 2, 1)]
    assert rungs[0].configs == [f"c{i}" for i in range(23, 15, -1)]  # the top 8 of S=8, best first
    assert rungs[1].configs == ["c16", "c17", "c18"]  # the top 3 at S=4 (ranking reversed)
    assert rungs[2].configs == ["c16", "c17"]
    assert p.next_rung(stages) is None and p.returned(stages) == "c16"
    assert [(s, score.mean) for s, score in p.trail(stages, "c16")] == [(8, 0.16), (4, -0.16), (2, -0.16), (1, -0.16)]
    assert stages[1]["c16"].count == 2  # seed repeats at surrogate scales, one run at full size
    assert stages[3]["c16"].count == 1
    assert p.cost(24) == pytest.approx(8 * 2 / 16 + 3 * 2 / 4 + 2)
    assert p.describe(24) == "8×2 seeds at S=4, 3×2 seeds at S=2, 2 at full size: about 4.50 full-size trainings " \
                             "(compute ∝ width²); if the target does worse than its surrogate, up to 2 more at " \
                             "full size (at most 6.50)"
    assert p.escalation_cost(24) == 0 and policy(scale=8, seeds=2).escalation_cost(24) > 0


def test_top_k_without_ladder_returns_the_best_at_full_size():
    p = policy(scale=4, ladder=False, top_k=3, mode="min")
    search = {"a": Score(1.0, 0, 1), "b": Score(0.5, 0, 1), "c": Score(0.7, 0, 1), "d": Score(0.9, 0, 1)}
    rungs, stages = run_stages(p, search, lambda c, s: {"a": 0.1, "b": 0.9, "c": 0.3, "d": 0.2}[c])
    assert [(r.scale, r.configs) for r in rungs] == [(1, ["b", "c", "d"])]
    assert p.returned(stages) == "d"  # third at S=4, best on full-size validation


def test_ladder_stops_at_the_number_of_scored_configs_and_keeps_top_k():
    p = policy(scale=16, ladder=True, eta=2, top_k=4)
    assert p.scales() == [16, 8, 4, 2, 1]
    assert p.schedule(5) == [(8, 5, 1), (4, 4, 1), (2, 4, 1), (1, 4, 1)]  # the first rung: 4 and 1 probe left
    assert policy(scale=16, ladder=True, eta=2, top_k=4, probes=0).schedule(5)[0] == (8, 4, 1)
    assert policy(scale=1, ladder=True).scales() == [1, 1]  # unshrunk search: the target is a full-size re-run
    assert policy(scale=1).schedule(5) == [(1, 1, 1)]  # of its best configuration alone


@pytest.mark.parametrize("options, rungs", [
    ({"slots": 1}, [(4, 8), (2, 3)]),
    ({"slots": 2}, [(4, 8), (2, 2)]),  # 3 at S=2 would train as trials of 2 and 1: twice the time of 1 and 1
    ({"slots": 2, "seeds": 2}, [(4, 8), (2, 3)]),  # 3 × 2 seeds fill 3 rounds
    ({"slots": 4}, [(4, 8), (2, 3)]),  # a last round 3/4 full is kept (and none is added)
    ({"slots": 3}, [(4, 8), (2, 3)]),
    ({"slots": 2, "top_k": 2}, [(4, 8), (2, 3)]),  # 2 at S=2 would choose nothing for the 2 targets
])
def test_rungs_leave_out_a_last_round_of_the_trial_slots_at_most_half_full(options, rungs):
    p = policy(scale=8, probes=0, **options)
    assert [(scale, count) for scale, count, _ in p.schedule(24)[:-1]] == rungs
    search = scores_of((f"c{i:02d}", i / 100) for i in range(24))
    trained, _ = run_stages(p, search, lambda c, scale: int(c[1:]) / 100)
    assert [(r.scale, r.configs) for r in trained][:2] == [(4, [f"c{i}" for i in range(23, 15, -1)]),
                                                          (2, [f"c{i}" for i in range(23, 23 - rungs[1][1], -1)])]


def test_options_that_cannot_act_unshrunk_or_without_stages_are_refused():
    for unshrunk in ({"top_k": 3}, {"ladder": False, "disagreement": Disagreement.LIKELY}, {"max_target_drop": 0.005}):
        with pytest.raises(ValueError) as refused:
            policy(scale=1, **unshrunk)
        shown = ", ".join(f"{k}=Disagreement.LIKELY" if k == "disagreement" else f"{k}={v!r}"
                          for k, v in unshrunk.items())
        assert str(refused.value) == (f"TransferPolicy: {shown} cannot act, scale is 1: the search trains full-size "
                                      f"models and only its best configuration trains again; these options shape the "
                                      f"stages after a shrunk search: leave them at their defaults, or shrink the "
                                      f"search (scale > 1; hydro tune --scale)")
    with pytest.raises(ValueError, match=r"eta=2 cannot act, transfer_fraction is None: no stage trains after the "
                                         r"search; .* or give a transfer_fraction$"):
        policy(scale=8, fraction=None, eta=2)
    # what can act is taken: seeds repeat the search's members; defaults given explicitly change nothing
    assert policy(scale=1, seeds=3, ladder=True, top_k=1, probe_margin=0.01).seeds == 3
    assert policy(scale=8, fraction=None, seeds=2).seeds == 2 and policy(scale=2, top_k=3).top_k == 3


def test_an_unshrunk_re_run_is_no_regression():
    """Scale 1 re-trains the search's best at full size: scoring below its own search run is the winner's curse of
    a maximum over noisy runs, not a surrogate's choice failing to transfer."""
    search = scores_of([("c0", 0.9), ("c1", 0.8)])
    rungs, stages = run_stages(policy(scale=1), search, lambda c, s: 0.85)
    assert [(r.scale, r.configs) for r in rungs] == [(1, ["c0"])] and policy(scale=1).regression(stages) is None
    rungs, stages = run_stages(policy(scale=2, fallback_targets=0), search, lambda c, s: 0.85)
    assert policy(scale=2, fallback_targets=0).regression(stages).drop == pytest.approx(0.05 / 0.9)  # shrunk: one


def test_defaults_are_the_ladder_and_one_target():
    p = policy(scale=8)
    assert p.schedule(16) == [(4, 9, 1), (2, 2, 1), (1, 1, 1)]  # the best 6 at S=4 and 3 probes from below the cut
    assert p.disagreement is Disagreement.PROBE and p.probes == 3 and p.probing()
    # probes train only where they can escalate: S >= 8, with the ladder and escalation, PROBE's rule
    for no in (policy(scale=4), policy(scale=8, escalate=False), policy(scale=8, ladder=False),
               policy(scale=8, disagreement=Disagreement.LIKELY), policy(scale=8, probes=0)):
        assert not no.probing()
    assert policy(scale=8, disagreement=Disagreement.LIKELY).schedule(16)[0] == (4, 6, 1)


def test_transfer_check_warns_when_rankings_disagree():
    p = policy(scale=4, ladder=False, top_k=5, min_agreement=0.5)
    search = scores_of((c, v) for c, v in zip("abcde", [5, 4, 3, 2, 1]))
    agree = [search, scores_of((c, v) for c, v in zip("abcde", [0.9, 0.8, 0.85, 0.5, 0.1]))]
    disagree = [search, scores_of((c, v) for c, v in zip("abcde", [1, 2, 3, 4, 5]))]
    (check,) = p.checks(agree)
    assert (check.coarse, check.fine, check.configs, check.low) == (4, 1, 5, False)
    assert check.rho == pytest.approx(0.9)
    assert p.checks(disagree)[0].low and p.checks(disagree)[0].rho == pytest.approx(-1.0)
    two = [search, scores_of([("a", 1.0), ("b", 2.0)])]
    assert math.isnan(p.checks(two)[0].rho) and not p.checks(two)[0].low  # too few to judge


def test_transfer_check_is_low_only_when_the_disagreement_is_beyond_the_noise_of_few_configurations():
    """6 configurations with a weak rank agreement (rho 0.26): the upper bound is above 0.5, no alarm; a weak
    agreement (rho 0.23) over 40 configurations is confidently low."""
    p = policy(scale=4, ladder=False, top_k=40, min_agreement=0.5)

    def check(fine: list[int]):
        ids = [f"c{i}" for i in range(len(fine))]
        return p.checks([scores_of(zip(ids, range(len(fine)))), scores_of(zip(ids, fine))])[0]

    few = check([0, 2, 4, 5, 3, 1])
    assert few.rho == pytest.approx(spearmanr(range(6), [0, 2, 4, 5, 3, 1]).statistic) and 0.25 < few.rho < 0.27
    assert few.upper > 0.5 and not few.low
    shifted = [(i + 6) % 40 for i in range(40)]
    many = check(shifted)
    assert many.rho == pytest.approx(spearmanr(range(40), shifted).statistic) and 0.2 < many.rho < 0.25
    assert many.upper < 0.5 and many.low
    assert math.isnan(rho_upper_bound(0.3, 3))  # fewer than 4 cannot be judged
    assert rho_upper_bound(0.0, 1003) == pytest.approx(math.tanh(ONE_SIDED_95 * math.sqrt(1 / 1000)))


@pytest.mark.parametrize("mode, surrogate, full, drop", [("max", 0.6433, 0.6183, 0.0389),  # resmlp, seed 0
                                                        ("max", 0.9578, 0.9470, 0.0113),  # 1.13%: above 1%
                                                        ("max", 0.9578, 0.9489, None),    # 0.93%: within 1%
                                                        ("max", 0.9756, 0.9800, None),    # full size better
                                                        ("min", 2.40, 2.52, 0.05),       # a loss that rose
                                                        ("min", 2.53, 2.44, None)])
def test_a_full_size_target_worse_than_its_surrogate_is_a_regression(mode, surrogate, full, drop):
    p = policy(scale=4, eta=2, mode=mode)  # ladder: S=4 search, S=2 rung, full size
    sign = 1 if mode == "max" else -1
    search = scores_of([("a", sign * 1.0), ("b", sign * 0.5)])
    stages = [search, scores_of([("a", surrogate)]), scores_of([("a", full)])]
    regression = p.regression(stages)
    if drop is None:
        assert regression is None
    else:
        assert (regression.config, regression.scale, regression.surrogate, regression.full_size) == \
            ("a", 2, surrogate, full)
        assert regression.drop == pytest.approx(drop, abs=1e-4)
    assert p.regression(stages[:2]) is None  # no full-size score yet
    with pytest.raises(ValueError, match="max_target_drop must be >= 0"):
        policy(max_target_drop=-0.1)


def fallback_policy(**kwargs):  # S=8 search, S=4 and S=2 rungs, no escalation (below)
    return policy(scale=8, ladder=True, eta=2, fallback_targets=2, escalate=False, **kwargs)


def ladder_search():
    """8 configurations at S=8, c7 best; S=4 keeps c7..c4 and reverses them (c4 best), S=2 keeps c4, c5."""
    return scores_of((f"c{i}", i / 10) for i in range(8))


def ladder_quality(full):
    def quality(config, scale):
        i = int(config[1:])
        return {8: i / 10, 4: 1 - i / 10, 2: 1 - i / 10, 1: full.get(config, 0.0)}[scale]
    return quality


def test_fallback_targets_train_only_when_the_target_regresses_and_the_best_full_size_one_is_returned():
    p = fallback_policy()
    # c4 scores 0.6 at S=2 and 0.5 at full size (17% worse): c5 (second at S=2), then c6 (best of the rest at
    # S=4) train at full size; c6 does best there and is returned, though the target was c4.
    rungs, stages = run_stages(p, ladder_search(), ladder_quality({"c4": 0.5, "c5": 0.45, "c6": 0.55, "c7": 0.9}))
    assert [(r.scale, r.configs) for r in rungs] == [(4, ["c7", "c6", "c5", "c4"]), (2, ["c4", "c5"]),
                                                     (1, ["c4"]), (1, ["c5", "c6"])]
    assert not p.final(stages[:3]) and p.final(stages[:4])  # a fallback can follow the target, not itself
    assert p.returned(stages) == "c6" and p.returned(stages[:4]) == "c4"
    assert [(s, score.mean) for s, score in p.trail(stages, "c6")] == [(8, 0.6), (4, 0.4), (1, 0.55)]
    assert p.trail(stages, "c4")[-1] == (1, Score(0.5, 0.0, 1))
    regression = p.regression(stages)  # c6 did better at full size than at S=4: no regression left
    assert regression is None and p.regression(stages[:4]).config == "c4"
    # the full-size stages are one scale to the checks: S=2 vs full size over c4, c5 (both trained at both)
    assert [(c.coarse, c.fine, c.configs) for c in p.checks(stages)] == [(8, 4, 4), (4, 2, 2), (2, 1, 2)]
    assert p.describe(8) == "4 at S=4, 2 at S=2, 1 at full size: about 1.75 full-size trainings (compute ∝ " \
                            "width²); if the target does worse than its surrogate, up to 2 more at full size " \
                            "(at most 3.75)"


def test_no_fallback_when_the_target_holds_or_when_none_is_asked_for():
    holds = {"c4": 0.6 * 0.995}  # within max_target_drop (1%) of its S=2 score
    rungs, stages = run_stages(fallback_policy(), ladder_search(), ladder_quality(holds))
    assert [r.scale for r in rungs] == [4, 2, 1] and fallback_policy().returned(stages) == "c4"
    regressed = ladder_quality({"c4": 0.5})
    none = {"scale": 8, "ladder": True, "eta": 2, "fallback_targets": 0, "escalate": False}
    rungs, stages = run_stages(policy(**none), ladder_search(), regressed)
    assert [r.scale for r in rungs] == [4, 2, 1] and policy(**none).regression(stages).config == "c4"
    assert policy(**none).final(stages[:3])
    assert not policy(scale=8, ladder=True, eta=2, escalate=False).final(stages[:3])  # default: 2 fallback targets
    assert "if the target" not in policy(**none).describe(16) and "up to 2 more" in policy(scale=8).describe(16)
    assert policy(scale=1, fallback_targets=2).fallbacks(16) == 0  # unshrunk: nothing to fall back from


def test_fallback_targets_are_bounded_by_the_configurations_left():
    p = policy(scale=4, ladder=False, top_k=2, fallback_targets=5)  # 3 configurations, 2 of them targets
    search = scores_of([("a", 0.9), ("b", 0.8), ("c", 0.7)])
    rungs, stages = run_stages(p, search, lambda c, s: {"a": 0.5, "b": 0.4, "c": 0.3}[c] if s == 1 else None)
    assert [(r.scale, r.configs) for r in rungs] == [(1, ["a", "b"]), (1, ["c"])]  # one left, once
    assert p.returned(stages) == "a" and p.fallbacks(3) == 1 and p.next_rung(stages) is None
    failed = [search, {}]  # the targets failed: no score, so no regression and no fallback
    assert p.next_rung(failed) is None and p.returned(failed) == "a"
    with pytest.raises(ValueError, match="fallback_targets must be an int >= 0"):
        policy(fallback_targets=-1)


def escalation_quality(s4: dict, s2: dict, full: dict):
    """Scores of ``ladder_search()``'s configurations at S=4, S=2, full size (0 where not given)."""
    def quality(config, scale):
        return {8: int(config[1:]) / 10, 4: s4.get(config, 0.0), 2: s2.get(config, 0.0), 1: full.get(config, 0.0)}[scale]
    return quality


def test_a_low_first_check_escalates_every_configuration_to_s_over_2_and_the_ladder_goes_on_from_there():
    p = policy(scale=8, ladder=True, eta=2, fallback_targets=0)
    reversed_at_4 = {f"c{i}": 1 - i / 10 for i in range(8)}  # c0 best, c7 worst: the opposite of S=8
    rungs, stages = run_stages(p, ladder_search(), escalation_quality(reversed_at_4, {"c0": 0.95}, {"c0": 0.96}))
    assert [(r.scale, r.configs, r.kind) for r in rungs] == [  # the first rung: the best 4 and 2 probes
        (4, ["c7", "c6", "c5", "c4", "c3", "c1"], RungKind.LADDER), (4, ["c2", "c0"], RungKind.ESCALATION),
        (2, ["c0", "c1", "c2", "c3"], RungKind.LADDER), (1, ["c0"], RungKind.LADDER)]  # the ladder from S=4 over all 8
    assert rungs[1].why == "the rankings at S=8 and S=4 disagree (Spearman -1.00 over 6 configurations, 95% upper " \
                           "bound -1.00)"
    assert p.returned(stages) == "c0" and p.regression(stages) is None and p.next_rung(stages) is None
    assert [(s, score.mean) for s, score in p.trail(stages, "c0")] == [(8, 0.0), (4, 1.0), (2, 0.95), (1, 0.96)]
    assert [(c.coarse, c.fine, c.configs) for c in p.checks(stages)] == [(8, 4, 8), (4, 2, 4), (2, 1, 1)]
    assert p.rungs(stages) == rungs and p.final(stages[:4])  # the target: no fallback asked for, escalated already
    assert not policy(scale=8, ladder=True, eta=2).final(stages[:4])  # default: fallback targets can follow


def test_a_likely_disagreement_escalates_where_a_confident_one_does_not():
    # The failure seen on the fidelity benchmark (residual MLP, seed 3): the first rung's 6 configurations rank
    # with rho 0.37 at S=4 (95% upper bound 0.88: not confidently below 0.5), and the best ones at S=4 (c2, c0)
    # were below the ladder's cut at S=8.
    search = scores_of((f"c{i}", i / 100) for i in range(12))  # c11 best at S=8; the first rung: c11..c6
    s4 = {"c11": 0.2, "c10": 0.5, "c9": 0.6, "c8": 0.4, "c7": 0.3, "c6": 0.1, "c2": 0.9, "c0": 0.8}
    quality = lambda config, scale: {8: search[config].mean, 4: s4.get(config, 0.0), 2: s4.get(config, 0.0),
                                     1: s4.get(config, 0.0)}[scale]
    confident = policy(scale=8, ladder=True, eta=2, fallback_targets=0, num_samples=12,
                       disagreement=Disagreement.CONFIDENT)
    rungs, stages = run_stages(confident, search, quality)
    assert confident.checks(stages)[0].rho == pytest.approx(0.3714, abs=1e-4) and not confident.checks(stages)[0].low
    assert [r.kind for r in rungs] == [RungKind.LADDER] * 3 and confident.returned(stages) == "c9"
    likely = policy(scale=8, ladder=True, eta=2, fallback_targets=0, num_samples=12,
                    disagreement=Disagreement.LIKELY)
    rungs, stages = run_stages(likely, search, quality)
    assert [(r.scale, r.kind) for r in rungs] == [(4, RungKind.LADDER), (4, RungKind.ESCALATION), (2, RungKind.LADDER),
                                                  (1, RungKind.LADDER)]
    assert rungs[1].configs == ["c5", "c4", "c3", "c2", "c1", "c0"] and likely.returned(stages) == "c2"
    assert rungs[1].why == "the rankings at S=8 and S=4 disagree (Spearman 0.37 over 6 configurations, 95% upper " \
                           "bound 0.88)"
    # fewer than 4 configurations at S/2 are never judged, whatever their rho
    few = policy(scale=8, ladder=True, eta=4, fallback_targets=0, num_samples=12, disagreement=Disagreement.LIKELY)
    rungs, stages = run_stages(few, search, lambda config, scale: -search[config].mean if scale == 4 else 0.5)
    assert few.checks(stages)[0].configs == 3 and few.checks(stages)[0].rho == -1.0
    assert RungKind.ESCALATION not in [r.kind for r in rungs]
    with pytest.raises(ValueError, match="disagreement must be a schedulers.transfer.Disagreement "
                                         r"\(Disagreement.PROBE, Disagreement.LIKELY, Disagreement.CONFIDENT\), "
                                         "got 'likely'"):
        policy(disagreement="likely")


def test_probes_from_below_the_cut_escalate_when_s_over_2_would_promote_one_and_only_then():
    # The two cases the fidelity benchmark separates. Residual MLP, seed 3: the best configurations at S=4 ranked
    # 12th, 13th, 7th, 5th and 1st at S=8, so the 7th (c09, the first probe) is S=4's best of the first rung.
    search = scores_of((f"c{i:02d}", i / 100) for i in range(16))  # c15 best at S=8; the cut keeps c15..c10
    s4 = {"c04": 0.9, "c03": 0.85, "c09": 0.8, "c11": 0.75, "c15": 0.7, "c14": 0.3, "c13": 0.35, "c12": 0.2,
          "c10": 0.25, "c07": 0.1, "c05": 0.15}
    p = policy(scale=8, num_samples=16)  # the default: PROBE, 3 probes, eta 3
    quality = lambda config, scale: search[config].mean if scale == 8 else s4.get(config, 0.0)
    rungs, stages = run_stages(p, search, quality)
    assert [(r.scale, r.kind) for r in rungs] == [(4, RungKind.LADDER), (4, RungKind.ESCALATION), (2, RungKind.LADDER),
                                                  (1, RungKind.LADDER)]
    assert rungs[0].configs == [f"c{i:02d}" for i in range(15, 9, -1)] + ["c09", "c07", "c05"]  # 6, 3 probes
    assert rungs[1].configs == ["c08", "c06", "c04", "c03", "c02", "c01", "c00"]  # the rest, to rank all 16 at S=4
    assert rungs[2].configs == ["c04", "c03", "c09", "c11", "c15", "c13"] and p.returned(stages) == "c04"
    assert not p.checks(stages[:2])[0].low  # the confident rule alone would have let it through
    assert rungs[1].why == "the cut at S=8 dropped what S=4 promotes: c09 ranked 7 at S=8 (cut: 6) and ranks 1 at " \
                           "S=4 (kept: 2), 14.3% ahead of the best left out"
    # Wide residual MLP, seed 0: the first rung's 8 close configurations ranked at S=4 with rho 0.36 (noise: all 24
    # agreed at 0.84) and the probes below what the next rung keeps: LIKELY escalates, PROBE does not.
    search = scores_of((f"c{i:02d}", i / 100) for i in range(24))  # the cut keeps c23..c16, the next rung 3
    s4 = {"c23": 0.78, "c22": 0.60, "c21": 0.75, "c20": 0.50, "c19": 0.40, "c18": 0.80, "c17": 0.45, "c16": 0.55,
          "c15": 0.58, "c13": 0.30, "c11": 0.35}
    quality = lambda config, scale: search[config].mean if scale == 8 else s4.get(config, 0.0)
    likely = policy(scale=8, disagreement=Disagreement.LIKELY)
    rungs, stages = run_stages(likely, search, quality)
    assert likely.checks(stages[:2])[0].rho == pytest.approx(0.381, abs=1e-3) and rungs[1].kind == RungKind.ESCALATION
    rungs, stages = run_stages(p, search, quality)
    assert [(r.scale, r.kind) for r in rungs] == [(4, RungKind.LADDER), (2, RungKind.LADDER), (1, RungKind.LADDER)]
    assert len(rungs[0].configs) == 11 and rungs[1].configs == ["c18", "c23", "c21"] and p.returned(stages) == "c18"


def test_a_probe_ahead_of_the_best_left_out_by_noise_is_not_promoted():
    # benchmarks/e2e_tuning.py with Optuna TPE: 64 configurations, cut 22, probes at ranks 23, 25 and 27, the next
    # rung keeps 8. TPE's configurations scored alike at S=4, in steps of one validation sample of 450: the probe
    # (c26 here) ranked 5th, one sample ahead of the 6th to the 9th, the best configuration left out (0.22%).
    search = scores_of((f"c{i:02d}", 1 - i / 100) for i in range(64))  # c00 best at S=8
    s4 = {f"c{i:02d}": 442 / 450 for i in range(22)}
    s4.update({"c00": 444 / 450, "c01": 444 / 450, "c02": 443 / 450, "c03": 443 / 450, "c26": 443 / 450,
               "c22": 0.95, "c24": 0.96})
    quality = lambda config, scale: search[config].mean if scale == 8 else s4.get(config, 0.9)
    for margin, kinds in ((0.0, [RungKind.LADDER, RungKind.ESCALATION]), (0.01, [RungKind.LADDER, RungKind.LADDER]),
                          (math.inf, [RungKind.LADDER, RungKind.LADDER])):
        p = policy(scale=8, num_samples=64, probe_margin=margin)
        rungs, _ = run_stages(p, search, quality)
        assert rungs[0].configs[22:] == ["c22", "c24", "c26"] and [r.kind for r in rungs[:2]] == kinds, margin
    assert rungs[1].configs == ["c00", "c01", "c02", "c03", "c26", "c04", "c05", "c06"]  # the probe goes on
    escalation = run_stages(policy(scale=8, num_samples=64, probe_margin=0.0), search, quality)[0][1]
    assert escalation.why == "the cut at S=8 dropped what S=4 promotes: c26 ranked 27 at S=8 (cut: 22) and ranks 5 " \
                             "at S=4 (kept: 8), 0.2% ahead of the best left out"
    # a probe S/2 keeps because too few others have a score there (failed members) is not promoted: it leads nothing
    failed = lambda config, scale: quality(config, scale) if scale != 4 or config in ("c00", "c26") else math.nan
    rungs, _ = run_stages(policy(scale=8, num_samples=64, probe_margin=0.0), search, failed)
    assert rungs[1].kind == RungKind.LADDER and rungs[1].configs == ["c00", "c26"]


def test_a_regressed_target_escalates_once_then_falls_back():
    p = policy(scale=8, ladder=True, eta=2, probes=0)  # no probe to see c3 at S=4 before the target regresses
    s4 = {"c7": 0.7, "c6": 0.6, "c5": 0.5, "c4": 0.4, "c3": 0.9, "c2": 0.3, "c1": 0.2, "c0": 0.1}  # agrees on c7..c4
    s2 = {"c7": 0.7, "c6": 0.6, "c5": 0.5, "c3": 0.95}
    rungs, stages = run_stages(p, ladder_search(), escalation_quality(s4, s2, {"c7": 0.5, "c3": 0.96}))
    assert [(r.scale, r.configs, r.kind) for r in rungs] == [
        (4, ["c7", "c6", "c5", "c4"], RungKind.LADDER), (2, ["c7", "c6"], RungKind.LADDER), (1, ["c7"], RungKind.LADDER),
        (4, ["c3", "c2", "c1", "c0"], RungKind.ESCALATION), (2, ["c3", "c5"], RungKind.LADDER), (1, ["c3"], RungKind.LADDER)]
    assert rungs[3].why == "the target c7 scored 0.5 at full size, 28.6% worse than at S=2 (0.7)"
    assert p.returned(stages) == "c3" and p.next_rung(stages) is None  # it held: no fallback
    assert not p.final(stages[:2]) and not p.final(stages[:5])  # escalation, then fallbacks could follow the targets
    # the escalated target regresses too: the fallback targets follow, in ladder order (S=2's ranking first)
    rungs, stages = run_stages(p, ladder_search(), escalation_quality(s4, s2, {"c7": 0.5, "c3": 0.5, "c6": 0.65}))
    assert [(r.scale, r.configs, r.kind) for r in rungs[5:]] == [(1, ["c3"], RungKind.LADDER), (1, ["c6", "c5"], RungKind.FALLBACK)]
    assert p.returned(stages) == "c6" and p.final(stages[:7])
    # a target that is the best at S=2 again after the escalation is not trained twice: the fallbacks follow
    rungs, stages = run_stages(p, ladder_search(), escalation_quality(s4, {**s2, "c3": 0.6}, {"c7": 0.5}))
    assert [(r.scale, r.configs, r.kind) for r in rungs[3:]] == [
        (4, ["c3", "c2", "c1", "c0"], RungKind.ESCALATION), (2, ["c3", "c5"], RungKind.LADDER), (1, ["c6", "c3"], RungKind.FALLBACK)]


def test_escalation_only_from_s_8_and_its_cost_is_shown_up_front():
    p = policy(scale=8)  # 16 configurations: 6 + 3 probes at S=4, 2 at S=2, 1 target; escalation: 7 at S=4, 6 at
    assert p.cost(16) == pytest.approx(9 / 16 + 2 / 4 + 1)  # S=2, 1 target
    assert p.escalation_cost(16) == pytest.approx(7 / 16 + 6 / 4 + 1)
    assert p.describe(16) == "9 at S=4 (3 of them probes from below the cut), 2 at S=2, 1 at full size: about 2.06 " \
                             "full-size trainings (compute ∝ width²); if the rankings at S=8 and S=4 disagree or " \
                             "the target does worse than its surrogate, all at S=4 and the ladder again from there: " \
                             "up to 2.94 more; if the target still does worse, up to 2 more at full size (at most 7.00)"
    for no in (policy(scale=4), policy(scale=8, escalate=False), policy(scale=1)):
        assert not no.can_escalate() and no.escalation_cost(16) == 0 and "disagree" not in no.describe(16)
    # S=4: a regressed target gets the fallback targets directly (an escalation would train all 16 at S=2)
    rungs, _ = run_stages(policy(scale=4, eta=2), ladder_search(), escalation_quality({}, {"c7": 0.7}, {"c7": 0.5}))
    assert [r.kind for r in rungs] == [RungKind.LADDER, RungKind.LADDER, RungKind.FALLBACK]


def test_stages_that_the_policy_would_not_have_trained_are_refused():
    p = policy(scale=8)
    search = scores_of([("a", 0.9), ("b", 0.8)])
    with pytest.raises(ValueError, match="stage 2 follows stages after which nothing was to train"):
        p.rungs([search, {}, scores_of([("a", 0.9)])])


def test_spearman_matches_scipy_with_ties():
    a, b = [0.3, 0.1, 0.1, 0.9, 0.5, 0.5], [1.0, 2.0, 2.0, 5.0, 3.0, 4.0]
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert math.isnan(spearman([1.0], [2.0])) and math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_due_and_best_skip_members_without_a_finite_result():
    p = policy(num_samples=4, fraction=0.5)
    assert not p.due({"m0": {"acc": math.nan}, "m1": None}, nothing_left=False)
    assert p.due({"m0": {"acc": math.nan}, "m1": {"acc": 0.5}}, nothing_left=False)
    assert p.best({"m0": {"acc": 0.5}, "m1": {"acc": 0.7}, "m2": {"acc": 0.7}}) == "m1"
    assert not policy(fraction=None).due({"m0": {"acc": 1.0}}, nothing_left=True)


@pytest.mark.parametrize("kwargs, message", [({"fraction": 0}, "transfer_fraction"), ({"top_k": 0}, "top_k"),
                                             ({"seeds": 0}, "seeds"), ({"eta": 1}, "eta"),
                                             ({"mode": "up"}, "mode"), ({"slots": 0}, "slots")])
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        policy(**kwargs)
