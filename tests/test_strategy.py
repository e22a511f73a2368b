import json

import pytest
from torch import nn

from autosync.strategy import Strategy, StrategyError, load_strategy, loads_strategy, save_strategy


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.enc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)


def named():
    return list(Net().named_parameters())


def test_default_round_trips_and_hash_is_stable(tmp_path):
    s = Strategy.default()
    assert s.is_lossless
    for name in ("s.yaml", "s.json"):
        save_strategy(s, tmp_path / name)
        again = load_strategy(tmp_path / name)
        assert again == s and again.hash == s.hash
    assert s.hash == loads_strategy(json.dumps(s.canonical())).hash
    assert Strategy.from_dict({"groups": [{"match": "*", "compressor": "fp16"}]}).hash != s.hash


def test_full_form_parses():
    s = loads_strategy("""
autosync: 1
sync: {mode: local_sgd, period: 8, warmup_steps: 20}
fusion: {bucket_cap_mb: 4, gradient_as_bucket_view: false, static_graph: true}
groups:
  - {match: "emb.*", plan: sharded_ps, partitions: 2, placement: [1, 0]}
  - {match: ["enc.*"], plan: allreduce, compressor: {name: powersgd, rank: 2}}
  - {match: "*", plan: ps}
""")
    assert s.sync.period == 8 and s.fusion.static_graph and s.groups[0].placement == (1, 0)
    assert not s.is_lossless
    assert s.resolve(named()) == [0, 1, 1, 2, 2]


@pytest.mark.parametrize("text, message", [
    ("groups: [{plan: gossip}]", "groups[0].plan: 'gossip' is not one of allreduce, ps, sharded_ps"),
    ("groups: [{compressor: {name: zip}}]", "groups[0].compressor.name: 'zip' is not one of none, fp16"),
    ("groups: [{plan: ps, compressor: {name: topk, ratio: 0.1}}]", "topk works only with plan allreduce"),
    ("groups: [{compressor: {name: topk, ratio: 2}}]", "groups[0].compressor.ratio: 2 is out of range"),
    ("groups: [{plan: allreduce, partitions: 2}]", "only plan sharded_ps takes partitions"),
    ("groups: [{plan: sharded_ps, partitions: 2, placement: [0]}]", "expected 2 owner rank(s), got 1"),
    ("groups: []", "groups: expected a non-empty list"),
    ("sync: {mode: gossip}", "sync.mode: 'gossip' is not one of bsp, local_sgd, ssp, adaptive"),
    ("sync: {mode: adaptive, threshold: 0}", "sync.threshold"),
    ("sync: {mode: ssp, period: 2}", "sync.period: only modes local_sgd, selective and diloco take it"),
    ("sync: {mode: bsp, period: 3}", "sync.period: only modes local_sgd, selective and diloco take it"),
    ("sync: {mode: selective}", "sync.islands: required for mode selective"),
    ("sync: {mode: selective, islands: [[0, 1], [3]]}", "sync.islands: every host 0..3 must be in exactly one island"),
    ("sync: {mode: selective, islands: [[0, 1], []]}", "sync.islands: expected a non-empty list of non-empty lists"),
    ("sync: {mode: selective, islands: 'a|b'}", "sync.islands: expected host lists like"),
    ("fusion: {bucket_cap_mb: -1}", "fusion.bucket_cap_mb: -1 is out of range"),
    ("fusion: {buckets: 3}", "fusion.buckets: unknown field"),
    ("autosync: 7", "autosync: schema version 7 is not supported"),
    ("optimizer_sharding: zero\nsync: {mode: local_sgd}", "zero cannot be combined"),
    ("groups: [{match: '*'}, {match: '*'}]", "only one group may be the catch-all"),
    ("groups: [{plan: ps}\n", "malformed YAML at line"),
    ("- just\n- a list", "strategy: expected a mapping"),
])
def test_validation_names_field_and_allowed_values(text, message):
    with pytest.raises(StrategyError) as e:
        loads_strategy(text, "s.yaml")
    assert message in str(e.value) and str(e.value).startswith("s.yaml: ")
    assert "\n" not in str(e.value)


def test_resolve_reports_uncovered_and_twice_covered_parameters():
    with pytest.raises(StrategyError, match="not covered by any group: head.weight, head.bias"):
        Strategy.from_dict({"groups": [{"match": ["emb.*", "enc.*"]}]}).resolve(named())
    with pytest.raises(StrategyError, match=r"covered by more than one group: enc.weight \(groups 0, 1\)"):
        Strategy.from_dict({"groups": [{"match": "enc.*"}, {"match": "*.weight"}, {"match": "*"}]}).resolve(named())
    with pytest.raises(StrategyError, match=r"groups\[1\].match: 'decoder.\*' matches no parameter"):
        Strategy.from_dict({"groups": [{"match": "*"}, {"match": "decoder.*"}]}).resolve(named())


def test_row_sparse_only_on_embeddings_and_placement_inside_world():
    s = Strategy.from_dict({"groups": [{"match": "enc.*", "plan": "row_sparse"}, {"match": "*"}]})
    with pytest.raises(StrategyError, match="row_sparse needs embedding tables, but enc.weight is not one"):
        s.resolve(named(), embedding_names={"emb.weight"})
    ps = Strategy.from_dict({"groups": [{"plan": "ps", "placement": [3]}]})
    ps.check_world(4)
    with pytest.raises(StrategyError, match=r"groups\[0\].placement\[0\]: rank 3 does not exist in a world of 2"):
        ps.check_world(2)


def test_lossless_flag():
    assert Strategy.from_dict({"groups": [{"plan": "sharded_ps", "partitions": 4}]}).is_lossless
    for comp in ("fp16", "bf16", {"name": "powersgd", "rank": 1}, {"name": "topk", "ratio": 0.1}):
        assert not Strategy.from_dict({"groups": [{"compressor": comp}]}).is_lossless
    assert not Strategy.from_dict({"sync": {"mode": "local_sgd"}}).is_lossless
