import pytest
import torch

from autosync import workloads


@pytest.mark.parametrize("name", list(workloads.BUILTINS))
def test_builtin_workload_contract(name):
    model, make_batch = workloads.build(name, seed=3)
    again, make_again = workloads.build(name, seed=3)  # the same seed builds the same model and data
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    batch_size = workloads.default_batch_size(name)
    batch = make_batch(batch_size, torch.Generator().manual_seed(0))
    loss = workloads.loss_of(model(**batch))
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None for p in model.parameters())
    other = make_again(batch_size, torch.Generator().manual_seed(0))
    assert all(torch.equal(batch[k], other[k]) for k in batch)


def test_the_bert_task_names_each_class_by_its_keywords():
    """Learnable: each class's 4 keywords (its 4 most frequent tokens) name every sequence's class."""
    _, make_batch = workloads.build("bert-mini")
    big = make_batch(4096, torch.Generator().manual_seed(1))
    keywords = [torch.bincount(big["input_ids"][big["labels"] == c].flatten(), minlength=8192).topk(4).indices
                for c in range(4)]
    batch = make_batch(64, torch.Generator().manual_seed(0))
    ids, labels = batch["input_ids"], batch["labels"]
    hits = torch.stack([torch.isin(ids, k).sum(1) for k in keywords], 1)
    assert torch.equal(hits.argmax(1), labels) and (hits.max(1).values >= 4).all()
    assert ids.unique().numel() > 0.5 * ids.numel(), "the other tokens must stay near uniform"


def test_ncf_is_embedding_heavy_and_touches_few_rows():
    model, make_batch = workloads.build("ncf")
    emb = workloads.embedding_parameter_names(model)
    assert emb == {"user_emb.weight", "item_emb.weight"}
    sizes = dict((n, p.numel()) for n, p in model.named_parameters())
    assert sum(sizes[n] for n in emb) > 0.95 * sum(sizes.values())
    batch = make_batch(workloads.default_batch_size("ncf"), torch.Generator().manual_seed(0))
    assert (batch["users"] == 0).float().mean() > 0.05, "ids follow a Zipf law: the first user recurs"
    workloads.loss_of(model(**batch)).backward()
    touched = (model.user_emb.weight.grad.abs().sum(1) != 0).float().mean().item()
    assert 0 < touched < 0.02


def test_user_workload_from_file_and_module(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(
        "import torch\n"
        "def build():\n"
        "    m = torch.nn.Linear(3, 1)\n"
        "    return m, lambda bs, g: {'input': torch.randn(bs, 3, generator=g)}\n")
    model, _ = workloads.build(f"{tmp_path}/mine.py:build")
    assert isinstance(model, torch.nn.Linear)
    monkeypatch.syspath_prepend(str(tmp_path))
    model, make_batch = workloads.build("mine:build")
    with pytest.raises(workloads.WorkloadError, match="scalar loss"):
        workloads.check_batch("mine:build", model, make_batch, 2)


def test_the_moe_decoder_leaves_experts_no_token_chose_with_a_zero_gradient():
    model, make_batch = workloads.build("moe-tiny")
    batch = make_batch(1, torch.Generator().manual_seed(0))
    batch = {k: v[:, :3] for k, v in batch.items()}            # 3 tokens x top-2 reach at most 6 of 8 experts
    workloads.loss_of(model(**batch)).backward()
    grad = model.model.layers[0].mlp.experts.gate_up_proj.grad
    touched = (grad.flatten(1).abs().sum(1) != 0).sum().item()
    assert 1 <= touched <= 6 < grad.shape[0]


def test_the_recommender_has_several_tables_and_draws_ids_by_a_power_law():
    model, make_batch = workloads.build("wide-recsys")
    emb = workloads.embedding_parameter_names(model)
    assert len(emb) == 16                                          # 8 deep tables, 8 wide (scalar) ones
    sizes = dict((n, p.numel()) for n, p in model.named_parameters())
    assert sum(sizes[n] for n in emb) > 0.95 * sum(sizes.values())
    batch = make_batch(1024, torch.Generator().manual_seed(0))
    first = batch["ids"][:, 0]
    assert (first < 100).float().mean() > 0.3                     # the head of the Zipf law recurs
    assert 0.3 < batch["labels"].mean().item() < 0.7


def test_the_campaign_leaves_out_contexts_whose_default_cannot_fit_a_trial():
    from autosync.cluster import Cluster
    from tools.campaign import default_comm_s, too_slow

    mb = 1 << 20
    assert abs(default_comm_s(100 * mb, Cluster.parse("2x1@1gbit")) - 100 * mb * 8 / 1e9) < 1e-9
    assert default_comm_s(100 * mb, Cluster.parse("3x1@1gbit;node2=100mbit")) > 10 * default_comm_s(
        100 * mb, Cluster.parse("3x1@1gbit"))
    assert too_slow(160 * mb, Cluster.parse("2x1@100mbit")) and not too_slow(160 * mb, Cluster.parse("2x1@1gbit"))


def test_a_resumed_campaign_logs_only_contexts_it_measured_something_in():
    from tools.campaign import _resumed_only

    assert _resumed_only({"ok": 0, "failed": 0, "timeout": 0, "skipped": 17})
    assert not _resumed_only({"ok": 3, "failed": 0, "timeout": 0, "skipped": 14}), "a partly resumed context is logged"
    assert not _resumed_only({"ok": 0, "failed": 1, "timeout": 0, "skipped": 16})
    assert not _resumed_only({"error": "RuntimeError: profiling failed"})


def test_the_campaign_status_counts_what_the_dataset_and_its_log_hold(tmp_path):
    import json

    from tools.campaign import status
    from autosync.datasets.schema import COLUMNS
    from autosync.datasets.store import DatasetStore
    from autosync.strategy import Strategy

    store = DatasetStore(tmp_path)
    local = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 4}})
    sfb = Strategy.from_dict({"groups": [{"plan": "sfb"}]})
    rows = []
    for ctx, cluster, sps, cv in (("a", "2x1@1gbit", (10.0, 30.0, 5.0), 0.02), ("b", "3x1@200mbit", (10.0, 20.0, 40.0), 0.10)):
        for (source, st), v in zip((("ddp_default", Strategy.default()), ("random", local), ("random", sfb)), sps):
            rows.append({**{c: None for c in COLUMNS}, "context_id": ctx, "cluster": cluster, "strategy_hash": st.hash,
                         "strategy": st.to_json(), "source": source, "status": "ok", "samples_per_s": v, "cv": cv})
    rows.append({**rows[0], "strategy_hash": "x", "status": "failed", "samples_per_s": None})
    store.append(rows)
    (tmp_path / "campaign.jsonl").write_text("\n".join(json.dumps({"pass": 1, "workload": w, "cluster": c, "start": 0,
                                                                   "end": 1800}) for w, c in (("w", "a"), ("w", "b"))))
    lines = status(store, tmp_path / "campaign.jsonl", planned=5)
    assert lines[0] == "2 of 5 contexts measured (pass 1: 2); 7 trials: 1 failed, 6 ok; 1.00 h of collection (campaign.jsonl)"
    assert lines[1] == "ok rows by sync mode: bsp 4, local_sgd 2"
    assert lines[2] == "ok rows with a group of each plan: allreduce 4, sfb 2"
    assert lines[3] == "median within-trial CV 6.0%; by cluster: 2x1@1gbit 2.0%, 3x1@200mbit 10.0%"
    assert lines[4] == ("best strategy of a context over its DDP default: median 3.50x (range 3.00-4.00x); "
                        "17% of the strategies are slower than the default")


def test_check_batch_runs_the_forward_on_the_models_device():
    """Batches are made on the CPU; a model on a GPU got them there and failed every profile (seen on an H200).
    The meta device stands in for the GPU here: the forward must see its inputs on the model's device."""
    model, make_batch = workloads.build("gpt2-tiny")
    model.to("meta")
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["input_ids"].device), with_kwargs=True)
    workloads.check_batch("gpt2-tiny", model, make_batch, 2)
    assert seen == [torch.device("meta")]
