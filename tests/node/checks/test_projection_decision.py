"""The kind-1 decision: every source's distance against its own calibrated threshold for the length."""

from node.checks.projection import ProjectionThresholds, decide_projection
from node.errors import Reason
from node.protocol.projection import LAST_HIDDEN, ProjectionMeasurement

# layer 0 separates 0.1 % weight noise, the last hidden state a fitted tail: their honest scales differ 25-fold
PER_SOURCE = ProjectionThresholds(0.03, {16: 0.03, 64: 0.025}, {0: ProjectionThresholds(0.002, {64: 0.00125})})


def measured(layer0: float, last: float) -> ProjectionMeasurement:
    return ProjectionMeasurement(64, (layer0, last), (layer0 + last) / 2, (0, LAST_HIDDEN))


def test_a_source_over_its_own_threshold_rejects_though_the_mean_is_small():
    m = measured(0.0030, 0.0100)  # weight noise: layer 0 far over its 0.00125, the mean under any last-state bound
    assert m.distance < PER_SOURCE.at(64)
    assert decide_projection(m, PER_SOURCE, 64) == Reason.FINGERPRINT_PROJECTION_DISTANCE


def test_each_source_uses_its_threshold_for_the_length():
    assert decide_projection(measured(0.0009, 0.020), PER_SOURCE, 64) == Reason.OK
    assert decide_projection(measured(0.0009, 0.027), PER_SOURCE, 64) == Reason.FINGERPRINT_PROJECTION_DISTANCE
    assert decide_projection(measured(0.0015, 0.020), PER_SOURCE, 64) == Reason.FINGERPRINT_PROJECTION_DISTANCE
    assert decide_projection(measured(0.0015, 0.020), PER_SOURCE, 32) == Reason.OK  # below 64: the flat 0.002


def test_sources_without_thresholds_of_their_own_share_the_flat_ones():
    flat = ProjectionThresholds(0.01)
    assert decide_projection(measured(0.009, 0.009), flat, 64) == Reason.OK
    assert decide_projection(measured(0.009, 0.011), flat, 64) == Reason.FINGERPRINT_PROJECTION_DISTANCE
