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


def test_ncf_is_embedding_heavy_and_touches_few_rows():
    model, make_batch = workloads.build("ncf")
    emb = workloads.embedding_parameter_names(model)
    assert emb == {"user_emb.weight", "item_emb.weight"}
    sizes = dict((n, p.numel()) for n, p in model.named_parameters())
    assert sum(sizes[n] for n in emb) > 0.95 * sum(sizes.values())
    batch = make_batch(workloads.default_batch_size("ncf"), torch.Generator().manual_seed(0))
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
