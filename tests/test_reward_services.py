"""The Scorer holds a service's scores to the rules' own checks: finite, within reward.max_abs_score,
one per response; what fails scores 0 and is counted in reward/errors, the service's counters summed."""
import math

from verirl.rewards import Scorer
from verirl.rewards.service import ServiceScores


class Fixed:
    """A service that returns the scores it is given (what a server or a model could return)."""
    name = "remote"

    def __init__(self, scores):
        self.scores = scores

    def score(self, responses, samples):
        return ServiceScores(list(self.scores), {"reward/remote/errors": 1.0})

    def outstanding(self):
        return []

    def close(self):
        pass


def _score(scores, n=4):
    s = Scorer(["acc", "remote"], [1.0, 2.0], workers=0, max_abs_score=1e6, services={"remote": Fixed(scores)})
    try:
        return s(["\\boxed{7}"] * n, [{"label": "7", "task": "t"}] * n)
    finally:
        s.close()


def test_absurd_and_non_finite_service_scores_are_errors():
    r = _score([(0.5, ""), (1e300, ""), (math.nan, ""), (None, "timed out")])
    assert r.per_rule["remote"] == [0.5, 0.0, 0.0, 0.0]
    assert r.totals == [1.0 + 2.0 * 0.5, 1.0, 1.0, 1.0]
    assert r.errors == 3 and r.counts == {"reward/remote/errors": 1.0}


def test_a_service_returning_the_wrong_number_of_scores_scores_none_of_them():
    r = _score([(1.0, "")] * 3)
    assert r.per_rule["remote"] == [0.0] * 4 and r.errors == 4
