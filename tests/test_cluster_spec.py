import pytest

from autosync.cluster import ClusterSpecError, Link, parse_cluster


@pytest.mark.parametrize("text, nodes, ranks, rate, latency", [
    ("2x2@1gbit,200us", 2, 2, 1e9, 200e-6),
    ("4x1@100mbit", 4, 1, 100e6, 0.0),
    ("1x4@10Gbit,1ms", 1, 4, 10e9, 1e-3),
    ("2 x 1 @ 2500kbit, 0.5ms", 2, 1, 2.5e6, 0.5e-3),
])
def test_parse(text, nodes, ranks, rate, latency):
    c = parse_cluster(text)
    assert (c.nodes, c.ranks_per_node, c.link.rate_bps, c.link.latency_s) == (nodes, ranks, rate, pytest.approx(latency))
    assert parse_cluster(c.spec()) == c


def test_heterogeneous_jitter_loss_and_paths():
    c = parse_cluster("3x1@500mbit,2ms,jitter=100us,loss=1%;node2=100mbit,4ms")
    assert c.world_size == 3 and c.heterogeneous
    assert c.link_of(0) == Link(500e6, 2e-3, 100e-6, 0.01)
    assert c.link_of(2) == Link(100e6, 4e-3)
    assert c.path(0, 2) == (100e6, pytest.approx(3e-3))
    assert parse_cluster(c.spec()) == c
    assert not parse_cluster("2x1@1gbit;node1=1gbit").heterogeneous  # an override equal to the default is none


def test_uneven_compute_and_stragglers():
    c = parse_cluster("3x1@1gbit;node1=100mbit;node1=cpu:0.5;stragglers=3x@20%,every=1s")
    assert c.speed_of(0) == 1.0 and c.speed_of(1) == 0.5 and c.min_speed == 0.5 and c.uneven_compute
    assert (c.stragglers.slowdown, c.stragglers.fraction, c.stragglers.slice_s) == (3.0, 0.2, 1.0)
    assert c.link_of(1).rate_bps == 100e6
    assert parse_cluster(c.spec()) == c
    assert not parse_cluster("2x1@1gbit;node1=cpu:1").uneven_compute   # full speed is no override
    assert parse_cluster("2x1@1gbit").spec() == "2x1@1gbit"           # specs without either keep their id


@pytest.mark.parametrize("text, message", [
    ("2x1@1gbit;node1=cpu:2", "cpu speed '2' must be a number in 0.05..1"),
    ("2x1@1gbit;node1=cpu:fast", "cpu speed 'fast' must be a number"),
    ("2x1@1gbit;node1=cpu:0.5;node1=cpu:0.4", "node1's compute speed is given twice"),
    ("2x1@1gbit;stragglers=3x", "must look like SLOWDOWNx@PERCENT%"),
    ("2x1@1gbit;stragglers=1x@10%", "straggler slowdown must be above 1"),
    ("2x1@1gbit;stragglers=2x@100%", "between 0% and 100%"),
    ("2x1@1gbit;stragglers=2x@10%,often", "unknown stragglers option"),
    ("", "cluster spec is empty"),
    ("2x2", "expected NODESxRANKS@BANDWIDTH"),
    ("2x0@1gbit", "must be at least 1"),
    ("0x2@1gbit", "must be at least 1"),
    ("2x1@fast", "needs a number and a unit"),
    ("2x1@100", "needs a number and a unit"),
    ("2x1@500kbit", "outside 1mbit..100gbit"),
    ("2x1@200gbit", "outside 1mbit..100gbit"),
    ("2x1@1gbit,2s", "latency 2000ms is over 1 s"),
    ("2x1@1gbit,5parsecs", "needs a number and a unit"),
    ("2x1@1gbit,1ms,loss=150%", "loss must be below 100%"),
    ("2x1@1gbit,1ms,loss=3", "must be a percentage"),
    ("2x1@1gbit,1ms,color=red", "unknown link option"),
    ("2x1@1gbit;node2=100mbit", "node2 does not exist"),
    ("2x1@1gbit;node1=1mbit;node1=2mbit", "node1 is overridden twice"),
    ("2x1@1gbit;n1=100mbit", "must look like nodeK=BANDWIDTH"),
])
def test_bad_specs_name_the_problem(text, message):
    with pytest.raises(ClusterSpecError) as e:
        parse_cluster(text)
    assert message in str(e.value) and "\n" not in str(e.value)
