"""Workloads: what is trained.

Contract: a workload is a function ``build() -> (model, make_batch)``. ``model`` is an
``nn.Module``; ``make_batch(batch_size, generator)`` returns a dict of keyword arguments for
one forward call, and ``model(**batch)`` returns a scalar loss tensor or an object with a
``.loss`` (the transformers convention).

Built-in workloads train on learnable synthetic tasks: the labels come from a fixed random
*teacher* (seeded independently of the model), so the loss can fall and lossy strategies
can be checked. Transformers architectures are built from configs: nothing is downloaded.
A user's workload is named ``pkg.module:function`` or ``path/to/file.py:function``.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from autosync.errors import UserError

MakeBatch = Callable[[int, torch.Generator], dict]
TEACHER_SEED = 1234


class WorkloadError(UserError):
    """An unknown workload, or one that cannot be built or run."""


@dataclass(frozen=True)
class BuiltinInfo:
    build: Callable[[], tuple[nn.Module, MakeBatch]]
    batch_size: int
    description: str
    lr: float | None = None     # the efficiency protocol's Adam learning rate; None: its default (efficiency.lr_of)


def _teacher(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(TEACHER_SEED))


ZIPF_EXPONENT = 1.05


def _zipf(rows: int) -> torch.Tensor:
    """Weights of a Zipf law over ``rows`` ids (id k drawn with probability ~ (k+1)^-ZIPF_EXPONENT), for
    ``torch.multinomial``: real categorical ids (users, items, features) are power-law, so frequent rows recur."""
    return torch.arange(1, rows + 1, dtype=torch.float64).pow(-ZIPF_EXPONENT)


def loss_of(output: Any) -> torch.Tensor:
    """The scalar loss of a forward call's output (a tensor, or an object with ``.loss``)."""
    loss = getattr(output, "loss", output)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise WorkloadError("the model must return a scalar loss tensor or an object with a .loss attribute")
    return loss


# --- built-ins -------------------------------------------------------------------------------

class _MLP(nn.Module):
    def __init__(self, dims: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-2], dims[1:-1]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(dims[-2], dims[-1]))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(x), labels)


def mlp() -> tuple[nn.Module, MakeBatch]:
    """A 4-layer MLP (~6.3M parameters, mostly dense matrices) on a linear teacher's classes."""
    d_in, classes = 512, 16
    teacher = _teacher(d_in, classes)

    def make_batch(batch_size: int, gen: torch.Generator) -> dict:
        x = torch.randn(batch_size, d_in, generator=gen)
        return {"x": x, "labels": (x @ teacher).argmax(1)}

    return _MLP([d_in, 2048, 1536, 1024, classes]), make_batch


def _keyword_batch(vocab: int, seq: int, classes: int, per_class: int = 4, inserts: int = 4) -> MakeBatch:
    """Sequence classification by keywords: each class owns ``per_class`` fixed random tokens; a sequence is
    uniform random tokens with ``inserts`` of its class's keywords written at random positions. The token
    distribution stays near uniform (a sequence holds about seq * classes * per_class / vocab stray keywords)."""
    keywords = torch.randperm(vocab, generator=torch.Generator().manual_seed(TEACHER_SEED))[:classes * per_class]
    keywords = keywords.view(classes, per_class)

    def make_batch(batch_size: int, gen: torch.Generator) -> dict:
        ids = torch.randint(0, vocab, (batch_size, seq), generator=gen)
        labels = torch.randint(0, classes, (batch_size,), generator=gen)
        where = torch.rand(batch_size, seq, generator=gen).argsort(1)[:, :inserts]
        which = torch.randint(0, per_class, (batch_size, inserts), generator=gen)
        ids.scatter_(1, where, keywords[labels[:, None], which])
        return {"input_ids": ids, "labels": labels}

    return make_batch


def bert_mini() -> tuple[nn.Module, MakeBatch]:
    """BERT, 4 layers x 256 hidden, sequence classification: 4 classes, each named by 4 of its keywords among
    64 random tokens (vocab 8192). Efficiency protocol at Adam lr 1e-4: at 1e-3 this post-LayerNorm BERT
    diverges (its loss fell to 0.01, then rose to 1.6)."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=128, num_labels=4,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg), _keyword_batch(8192, 64, 4)


def _markov_batch(vocab: int, seq: int, fanout: int = 4) -> MakeBatch:
    """Language modelling of a fixed sparse Markov chain: each token has ``fanout`` equally likely successors
    (a low-entropy chain a model can learn; the loss floor is log(fanout))."""
    successors = torch.randint(0, vocab, (vocab, fanout), generator=torch.Generator().manual_seed(TEACHER_SEED))

    def make_batch(batch_size: int, gen: torch.Generator) -> dict:
        ids = torch.empty(batch_size, seq, dtype=torch.long)
        ids[:, 0] = torch.randint(0, vocab, (batch_size,), generator=gen)
        choice = torch.randint(0, fanout, (batch_size, seq), generator=gen)
        for t in range(1, seq):
            ids[:, t] = successors[ids[:, t - 1], choice[:, t]]
        return {"input_ids": ids, "labels": ids}

    return make_batch


def gpt2_tiny() -> tuple[nn.Module, MakeBatch]:
    """GPT-2, 4 layers x 256, language modelling of a fixed sparse Markov chain (vocab 2048)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab, seq = 2048, 64
    cfg = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=256, n_layer=4, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    return GPT2LMHeadModel(cfg), _markov_batch(vocab, seq)


def llama_tiny() -> tuple[nn.Module, MakeBatch]:
    """LLaMA-style decoder (RMSNorm, rotary positions, grouped-query attention 8 heads / 2 KV heads, SwiGLU),
    4 layers x 256, untied head (~4.9M parameters), on a Markov chain (vocab 4096)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, seq = 4096, 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=seq,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None)
    return LlamaForCausalLM(cfg), _markov_batch(vocab, seq)


def moe_tiny() -> tuple[nn.Module, MakeBatch]:
    """Mixtral-style mixture-of-experts decoder: 4 layers x 256, 8 experts of 512 per layer, top-2 routing,
    grouped-query attention (~14.3M parameters, ~3.7M active per token). The experts of a layer are one fused
    tensor each (transformers' ``gate_up_proj`` / ``down_proj``): an expert no token chose this step gets an
    all-zero slice, so its gradient is sparse per step along the expert axis."""
    from transformers import MixtralConfig, MixtralForCausalLM

    vocab, seq = 2048, 64
    cfg = MixtralConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                        max_position_embeddings=seq, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                        pad_token_id=None)
    return MixtralForCausalLM(cfg), _markov_batch(vocab, seq)


def t5_tiny() -> tuple[nn.Module, MakeBatch]:
    """T5-style encoder-decoder, 4 + 4 layers x 256 (relative position buckets, shared embeddings, ~8.4M
    parameters): translate a random sentence token by token through a fixed random dictionary (vocab 4096)."""
    from transformers import T5Config, T5ForConditionalGeneration

    vocab, seq = 4096, 32
    cfg = T5Config(vocab_size=vocab, d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_decoder_layers=4,
                   num_heads=8, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    dictionary = torch.randperm(vocab - 2, generator=torch.Generator().manual_seed(TEACHER_SEED)) + 2

    def make_batch(batch_size: int, gen: torch.Generator) -> dict:
        src = torch.randint(2, vocab, (batch_size, seq), generator=gen)
        return {"input_ids": src, "labels": dictionary[src - 2]}

    return T5ForConditionalGeneration(cfg), make_batch


class _LSTMLM(nn.Module):
    """Embedding -> 2-layer LSTM -> untied softmax head."""

    def __init__(self, vocab: int, dim: int, hidden: int, layers: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(input_ids[:, :-1]))
        logits = self.head(h)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))


def lstm_lm() -> tuple[nn.Module, MakeBatch]:
    """Recurrent language model: embedding 256, 2-layer LSTM of 512, softmax over 4096 (~6.8M parameters),
    on a Markov chain (sequence 64)."""
    vocab, seq = 4096, 64
    return _LSTMLM(vocab, 256, 512, 2), _markov_batch(vocab, seq)


def _image_batch(channels: int, size: int, classes: int, pool: int = 4) -> MakeBatch:
    """Noise images; the class is a linear teacher's argmax over the ``pool`` x ``pool`` average-pooled image."""
    teacher = _teacher(channels * pool * pool, classes)

    def make_batch(batch_size: int, gen: torch.Generator) -> dict:
        x = torch.randn(batch_size, channels, size, size, generator=gen)
        pooled = nn.functional.adaptive_avg_pool2d(x, pool).flatten(1)
        return {"pixel_values": x, "labels": (pooled @ teacher).argmax(1)}

    return make_batch


def vit_tiny() -> tuple[nn.Module, MakeBatch]:
    """ViT, 4 layers x 192 hidden, 32x32 images in 4x4 patches, 10 teacher classes of the 2x2-pooled image.

    (A 4x4-pooled teacher left the loss flat over the efficiency horizon; 2x2 keeps it falling.)"""
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=32, patch_size=4, num_channels=3, hidden_size=192, num_hidden_layers=4,
                    num_attention_heads=3, intermediate_size=768, num_labels=10,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(cfg), _image_batch(3, 32, 10, pool=2)


def resnet_tiny() -> tuple[nn.Module, MakeBatch]:
    """ResNet (basic blocks, widths 32-256), 64x64 images, 10 teacher classes."""
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_channels=3, embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                       layer_type="basic", num_labels=10)
    return ResNetForImageClassification(cfg), _image_batch(3, 64, 10)


def convnext_tiny() -> tuple[nn.Module, MakeBatch]:
    """ConvNeXt (depthwise 7x7 convolutions, LayerNorm, inverted bottlenecks; widths 32-256, depths 1-1-2-1,
    ~1.0M parameters), 64x64 images, 10 teacher classes of the 4x4-pooled image."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(num_channels=3, patch_size=4, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1],
                         num_labels=10, drop_path_rate=0.0, image_size=64)
    return ConvNextForImageClassification(cfg), _image_batch(3, 64, 10)


class _NCF(nn.Module):
    """Neural collaborative filtering: two embedding tables (most of the bytes) and a small MLP."""

    def __init__(self, users: int, items: int, dim: int):
        super().__init__()
        self.user_emb = nn.Embedding(users, dim)
        self.item_emb = nn.Embedding(items, dim)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, users: torch.Tensor, items: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.user_emb(users), self.item_emb(items)], 1)
        return nn.functional.binary_cross_entropy_with_logits(self.mlp(h).squeeze(1), labels)


def ncf() -> tuple[nn.Module, MakeBatch]:
    """NCF with 200k users and 100k items x 64 (~77 MB of tables). Users and items follow a Zipf law, as real
    interactions do, so frequent rows recur and the click teacher (the sign of hidden 8-vectors' product) is
    learnable (held-out loss 0.697 -> 0.606 in 240 Adam steps on one process); a batch of 2048 touches
    ~1k distinct users and ~1k items. (With uniform ids each user is seen ~5 times in 240 steps and the loss stays
    at 0.693: a task too flat to rank strategies by convergence.)"""
    users, items, dim = 200_000, 100_000, 64
    tu, ti = _teacher(users, 8), _teacher(items, 8)
    zu, zi = _zipf(users), _zipf(items)

    def make_batch(batch_size: int, gen: torch.Generator) -> dict:
        u = torch.multinomial(zu, batch_size, replacement=True, generator=gen)
        i = torch.multinomial(zi, batch_size, replacement=True, generator=gen)
        return {"users": u, "items": i, "labels": ((tu[u] * ti[i]).sum(1) > 0).float()}

    return _NCF(users, items, dim), make_batch


class _WideDeep(nn.Module):
    """Wide & deep recommendation model (DLRM-style deep part): per sparse feature one embedding table for the
    deep part and one scalar table for the wide (linear) part; dense features through a bottom MLP; pairwise
    dot products of all vectors and a top MLP."""

    def __init__(self, rows: list[int], dim: int, dense: int):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(n, dim) for n in rows)
        self.wide = nn.ModuleList(nn.Embedding(n, 1) for n in rows)
        self.bottom = nn.Sequential(nn.Linear(dense, 128), nn.ReLU(), nn.Linear(128, dim), nn.ReLU())
        k = len(rows) + 1
        self.top = nn.Sequential(nn.Linear(dim + k * (k - 1) // 2, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                 nn.Linear(128, 1))
        for t in self.tables:       # small vectors keep the initial dot products near 0 (DLRM: U(+-1/sqrt(rows)))
            nn.init.normal_(t.weight, std=dim ** -0.5)
        for w in self.wide:         # the wide part is a linear model: it starts at 0
            nn.init.zeros_(w.weight)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        d = self.bottom(dense)
        vecs = torch.stack([d] + [t(ids[:, i]) for i, t in enumerate(self.tables)], 1)
        dots = vecs @ vecs.transpose(1, 2)
        i, j = torch.triu_indices(vecs.size(1), vecs.size(1), 1)
        wide = sum(w(ids[:, i]).squeeze(1) for i, w in enumerate(self.wide))
        logit = self.top(torch.cat([d, dots[:, i, j]], 1)).squeeze(1) + wide
        return nn.functional.binary_cross_entropy_with_logits(logit, labels)


def wide_recsys() -> tuple[nn.Module, MakeBatch]:
    """Wide & deep recommender with 8 embedding tables (300k down to 1k rows x 64, ~39.5M parameters, ~97% in
    the tables) and 13 dense features. Ids follow a Zipf law (``_zipf``), as real categorical features do, so
    frequent rows recur; the click teacher adds a hidden score per row, pairwise products of hidden
    4-vectors of the rows (what the dot interactions can learn, more slowly) and a linear term in the dense
    features. A batch of 1024 touches a few percent of the largest table's rows."""
    rows, dim, dense, k = [300_000, 150_000, 80_000, 40_000, 20_000, 10_000, 5_000, 1_000], 64, 13, 4
    gen0 = torch.Generator().manual_seed(TEACHER_SEED)
    scores = [torch.randn(n, generator=gen0) for n in rows]
    vectors = [torch.randn(n, k, generator=gen0) for n in rows]
    w_dense = torch.randn(dense, generator=gen0)
    zipf = [_zipf(n) for n in rows]
    pairs = len(rows) * (len(rows) - 1) // 2

    def make_batch(batch_size: int, gen: torch.Generator) -> dict:
        x = torch.randn(batch_size, dense, generator=gen)
        ids = torch.stack([torch.multinomial(z, batch_size, replacement=True, generator=gen) for z in zipf], 1)
        v = torch.stack([t[ids[:, i]] for i, t in enumerate(vectors)], 1)
        cross = (v @ v.transpose(1, 2)).triu(1).sum((1, 2)) / (pairs * k) ** 0.5
        linear = sum(s[ids[:, i]] for i, s in enumerate(scores)) / len(rows) ** 0.5
        logit = 0.5 * linear + cross + 0.5 * x @ w_dense / dense ** 0.5
        return {"dense": x, "ids": ids, "labels": (logit > 0).float()}

    return _WideDeep(rows, dim, dense), make_batch


BUILTINS: dict[str, BuiltinInfo] = {
    "mlp": BuiltinInfo(mlp, 128, mlp.__doc__ or ""),
    "bert-mini": BuiltinInfo(bert_mini, 8, bert_mini.__doc__ or "", lr=1e-4),
    "gpt2-tiny": BuiltinInfo(gpt2_tiny, 8, gpt2_tiny.__doc__ or ""),
    "vit-tiny": BuiltinInfo(vit_tiny, 16, vit_tiny.__doc__ or ""),
    "resnet-tiny": BuiltinInfo(resnet_tiny, 32, resnet_tiny.__doc__ or ""),
    "ncf": BuiltinInfo(ncf, 2048, ncf.__doc__ or ""),
    "llama-tiny": BuiltinInfo(llama_tiny, 8, llama_tiny.__doc__ or ""),
    "moe-tiny": BuiltinInfo(moe_tiny, 8, moe_tiny.__doc__ or ""),
    "t5-tiny": BuiltinInfo(t5_tiny, 8, t5_tiny.__doc__ or ""),
    "convnext-tiny": BuiltinInfo(convnext_tiny, 32, convnext_tiny.__doc__ or ""),
    "lstm-lm": BuiltinInfo(lstm_lm, 16, lstm_lm.__doc__ or ""),
    "wide-recsys": BuiltinInfo(wide_recsys, 1024, wide_recsys.__doc__ or ""),
}

DEFAULT_LR = 1e-3    # Adam's, for workloads that name none (BuiltinInfo.lr)


def lr_of(workload) -> float:
    """The efficiency protocol's Adam learning rate for ``workload``: a built-in's own (``BuiltinInfo.lr``), else
    ``DEFAULT_LR``."""
    info = BUILTINS.get(workload) if isinstance(workload, str) else None
    return getattr(info, "lr", None) or DEFAULT_LR

DEFAULT_BATCH_SIZE = 32


def _load_user_function(spec: str) -> Callable:
    target, _, fn_name = spec.rpartition(":")
    if not target or not fn_name:
        known = ", ".join(BUILTINS)
        raise WorkloadError(f"unknown workload {spec!r}: use a built-in ({known}) or 'pkg.module:function' "
                            "or 'path/file.py:function'")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise WorkloadError(f"workload {spec!r}: file {target} does not exist")
        mod_name = f"autosync_user_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as e:
            raise WorkloadError(f"workload {spec!r}: importing {target} failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise WorkloadError(f"workload {spec!r}: cannot import module {target!r} ({e})") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise WorkloadError(f"workload {spec!r}: {target} has no function {fn_name!r}")
    return fn


def default_batch_size(name) -> int:
    if isinstance(name, InMemory):
        return name.batch_size
    info = BUILTINS.get(name)
    return info.batch_size if info else DEFAULT_BATCH_SIZE


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
    except ImportError:
        pass


@dataclass(frozen=True)
class InMemory:
    """A model object and its make_batch, handed to rank processes by value (they get copies).

    ``make_batch`` must be picklable: a module-level function or a functools.partial of one.
    """

    name: str
    model: nn.Module
    make_batch: MakeBatch
    batch_size: int = DEFAULT_BATCH_SIZE

    def __str__(self) -> str:
        return self.name


def build(name, seed: int = 0) -> tuple[nn.Module, MakeBatch]:
    """Build a workload by name (or copy an InMemory one); validate its contract."""
    if isinstance(name, InMemory):
        import copy

        return copy.deepcopy(name.model), name.make_batch
    fn = BUILTINS[name].build if name in BUILTINS else _load_user_function(name)
    _quiet_transformers()
    torch.manual_seed(seed)
    try:
        result = fn()
    except UserError:
        raise
    except Exception as e:
        raise WorkloadError(f"workload {name!r}: building it failed: {type(e).__name__}: {e}") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)
            and callable(result[1])):
        raise WorkloadError(f"workload {name!r}: the function must return (nn.Module, make_batch)")
    model, make_batch = result
    if not any(p.requires_grad for p in model.parameters()):
        raise WorkloadError(f"workload {name!r}: the model has no trainable parameters")
    return model, make_batch


def check_batch(name: str, model: nn.Module, make_batch: MakeBatch, batch_size: int) -> None:
    """Run one forward pass on one batch, on the model's device (batches are made on the CPU); raise
    WorkloadError naming what went wrong."""
    try:
        batch = make_batch(batch_size, torch.Generator().manual_seed(0))
    except Exception as e:
        raise WorkloadError(f"workload {name!r}: make_batch raised {type(e).__name__}: {e}") from None
    if not isinstance(batch, dict):
        raise WorkloadError(f"workload {name!r}: make_batch must return a dict of keyword arguments")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    try:
        with torch.no_grad():
            loss_of(model(**batch))
    except UserError as e:
        raise WorkloadError(f"workload {name!r}: {e}") from None
    except Exception as e:
        raise WorkloadError(f"workload {name!r}: the forward call failed: {type(e).__name__}: {e}") from None


def embedding_parameter_names(model: nn.Module) -> set[str]:
    """Names of the weights of nn.Embedding modules (candidates for the row_sparse plan)."""
    return {f"{mod_name}.weight" if mod_name else "weight"
            for mod_name, mod in model.named_modules() if isinstance(mod, nn.Embedding)}
