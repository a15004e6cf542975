"""µP transfer benchmark of the Model Shrinker: does the surrogate's best learning rate equal the target's?

Two workloads, each a learning-rate sweep (powers of 2) at shrink scales S in {1, 2, 4, 8, 16}:
  * mlp: a 3-layer MLP (width 512 at S=1) on scikit-learn's digits, Adam;
  * lm:  a character-level Transformer LM (d_model 128, 2 layers, head_dim 8) on the Python standard
         library's own source files, Adam.
µP surrogates are ``hydro.shrink(target, S)``; standard-parametrization (SP) surrogates are the same
architecture built at width/S. Every sweep is one ``hydro.fuse`` model with one member per learning rate
(``hydro.optim`` with a per-member ``lr``). Then rank correlation (Spearman) between S=8 and S=1 (µP) final
losses over 16 random configurations (mlp: SGD lr, momentum, weight decay; lm: AdamW lr, betas, weight
decay). Final loss: mlp on the whole training set, lm on held-out text. Prints tables, writes ``mup_transfer.json`` and ``mup_transfer.png`` to ``--out``.

    python benchmarks/mup_transfer.py            # full run (2-7 minutes on 2 CPU cores)
    python benchmarks/mup_transfer.py --quick    # smaller models, fewer steps (about 30 seconds)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hydro
import hydro.optim
from hydro.loss import trial_losses

SCALES, QUICK_SCALES = (1, 2, 4, 8, 16), (1, 2, 4, 8)


class MLP(nn.Module):
    """``[N, 64] -> [N, 10]`` digits classifier with two hidden layers of ``width``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                    nn.Linear(width, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class TinyLM(nn.Module):
    """Causal character LM ``[N, context] -> [N, context, vocab]``: token + position embeddings, pre-LN
    Transformer encoder (``width // head_dim`` heads, feed-forward 4x), final LayerNorm, linear readout."""

    def __init__(self, width: int, vocab: int, context: int, layers: int = 2, head_dim: int = 8) -> None:
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, width // head_dim, 4 * width, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.tokens(tokens) + self.positions(torch.arange(tokens.size(1), device=tokens.device))
        causal = nn.Transformer.generate_square_subsequent_mask(self.context)
        return self.head(self.final_norm(self.blocks(h, mask=causal, is_causal=True)))


@dataclass
class Workload:
    """A model family ``make(width)``, its full width, data (``batch(step) -> (x, y)``, the fixed set the final
    loss is measured on), the per-member loss, the grid (log2 lr), the number of steps and the scales."""

    name: str
    make: Callable[[int], nn.Module]
    width: int
    batch: Callable[[int], tuple[Tensor, Tensor]]
    final_set: tuple[Tensor, Tensor]
    loss: Callable[[Tensor, Tensor], Tensor]
    log2_lrs: list[int]
    steps: int
    scales: tuple[int, ...]


def digits_workload(quick: bool) -> Workload:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = torch.tensor(x[order], dtype=torch.float32), torch.tensor(y[order])
    train = slice(0, 1400)
    mean, std = x[train].mean(0), x[train].std(0) + 1.0
    x = (x - mean) / std

    def batch(step: int) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, 1400, (64,), generator=torch.Generator().manual_seed(step))
        return x[train][idx], y[train][idx]

    # final loss: on the whole training set (digits is easy: held-out losses are flat over many learning rates
    # and their minimum is decided by noise of 400 samples)
    return Workload("mlp", MLP, 256 if quick else 512, batch, (x[train], y[train]), F.cross_entropy,
                    list(range(-14, -1)), 40 if quick else 80, QUICK_SCALES if quick else SCALES)


def stdlib_text(max_chars: int) -> str:
    """Concatenated Python sources of the standard library (sorted paths), at most ``max_chars``."""
    root, parts, total = Path(os.path.dirname(os.__file__)), [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


def text_workload(quick: bool) -> Workload:
    text = stdlib_text(2_000_000)
    # ids: printable ASCII 32..126 -> 1..95, newline -> 96, anything else -> 0
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    ids = np.where((codes >= 32) & (codes <= 126), codes - 31, np.where(codes == 10, 96, 0))
    data = torch.tensor(ids)
    split, context, vocab = int(0.9 * len(data)), 64, 97

    def windows(starts: Tensor) -> tuple[Tensor, Tensor]:
        rows = data[starts.unsqueeze(1) + torch.arange(context + 1)]
        return rows[:, :-1], rows[:, 1:]

    def batch(step: int) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(step)
        return windows(torch.randint(0, split - context - 1, (8,), generator=g))

    val = windows(torch.randint(split, len(data) - context - 1, (64,), generator=torch.Generator().manual_seed(-1)))

    def lm_loss(out: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    return Workload("lm", lambda w: TinyLM(w, vocab, context), 64 if quick else 128, batch, val, lm_loss,
                    list(range(-11, -1)), 40 if quick else 100, QUICK_SCALES if quick else SCALES)


def members(work: Workload, scale: int, count: int, mup: bool) -> list[nn.Module]:
    """``count`` identically initialised surrogates: µP ``shrink(target, scale)`` or SP ``make(width/scale)``."""
    out = []
    for _ in range(count):
        torch.manual_seed(0)
        out.append(hydro.shrink(work.make(work.width), scale) if mup else work.make(work.width // scale))
    return out


def train(work: Workload, models: list[nn.Module], optimizer: type, **hyper) -> list[float]:
    """Train ``models`` fused (one member per entry of the per-member ``hyper`` lists); final losses."""
    fused = hydro.fuse(models)
    opt = optimizer(fused.parameters(), **hyper)
    for step in range(work.steps):
        x, y = work.batch(step)
        opt.zero_grad(set_to_none=True)
        losses = trial_losses(work.loss, fused(x), y)
        torch.nan_to_num(losses, nan=0.0, posinf=0.0).sum().backward()  # diverged members stop mattering
        opt.step()
    with torch.no_grad():
        final = trial_losses(work.loss, fused(work.final_set[0]), work.final_set[1])
    return [v if math.isfinite(v) else float("inf") for v in final.tolist()]


def lr_sweep(work: Workload, mup: bool) -> dict[int, list[float]]:
    lrs = [2.0 ** k for k in work.log2_lrs]
    return {s: train(work, members(work, s, len(lrs), mup), hydro.optim.Adam, lr=lrs) for s in work.scales}


def best_log2_lr(work: Workload, losses: list[float]) -> int:
    return work.log2_lrs[int(np.argmin(losses))]


def random_configs(work: Workload, count: int) -> tuple[type, dict[str, list[float]]]:
    """``count`` random configurations: SGD (lr, momentum, weight decay) for mlp, AdamW (lr, betas, wd) for lm."""
    rng = np.random.default_rng(1)
    lo, hi = (-8, 0) if work.name == "mlp" else (-11, -4)
    hyper = {"lr": (2.0 ** rng.uniform(lo, hi, count)).tolist(),
             "weight_decay": (10.0 ** rng.uniform(-5, -1, count)).tolist()}
    if work.name == "mlp":
        return hydro.optim.SGD, {**hyper, "momentum": rng.uniform(0.0, 0.95, count).tolist()}
    betas = (rng.uniform(0.8, 0.95, count).tolist(), rng.uniform(0.95, 0.999, count).tolist())
    return hydro.optim.AdamW, {**hyper, "betas": betas}


def spearman(work: Workload, count: int) -> dict:
    from scipy.stats import spearmanr

    optimizer, hyper = random_configs(work, count)
    losses = {s: train(work, members(work, s, count, True), optimizer, **hyper) for s in (8, 1)}
    rho = spearmanr(losses[8], losses[1]).statistic
    return {"optimizer": optimizer.__name__, "configs": hyper, "losses": {str(s): v for s, v in losses.items()},
            "spearman": float(rho)}


def report(work: Workload, sweeps: dict[str, dict[int, list[float]]]) -> dict:
    best = {p: {s: best_log2_lr(work, losses) for s, losses in sweep.items()} for p, sweep in sweeps.items()}
    print(f"\n[{work.name}] best log2(lr) per scale S (width {work.width}/S); shift = grid steps from S=1")
    print(f"{'S':>4} {'width':>6} | {'µP best':>8} {'shift':>6} {'loss':>7} | {'SP best':>8} {'shift':>6} {'loss':>7}")
    for s in work.scales:
        cells = [f"{best[p][s]:>8} {best[p][s] - best[p][1]:>+6} {min(sweeps[p][s]):>7.4f}" for p in ("mup", "sp")]
        print(f"{s:>4} {work.width // s:>6} | {cells[0]} | {cells[1]}")
    shifts = {p: max(abs(best[p][s] - best[p][1]) for s in work.scales) for p in best}
    print(f"max |shift|: µP {shifts['mup']} (target <= 1), SP {shifts['sp']} (target >= 2)")
    return {"log2_lrs": work.log2_lrs, "width": work.width, "steps": work.steps, "scales": work.scales,
            "losses": {p: {str(s): v for s, v in sweep.items()} for p, sweep in sweeps.items()},
            "best_log2_lr": {p: {str(s): v for s, v in b.items()} for p, b in best.items()},
            "max_shift": shifts}


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["workloads"])
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 4 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        res = results["workloads"][name]
        for col, (param, title) in enumerate((("mup", "µP (hydro.shrink)"), ("sp", "standard parametrization"))):
            ax = axes[row][col]
            finite = [v for s in res["scales"] for v in res["losses"][param][str(s)] if math.isfinite(v)]
            top = min(max(finite), 2 * np.percentile(finite, 50))
            for s in res["scales"]:
                losses = [min(v, top) for v in res["losses"][param][str(s)]]
                ax.plot(res["log2_lrs"], losses, marker=".", label=f"S={s} (width {res['width'] // s})")
            ax.set_title(f"{name}: {title}")
            ax.set_xlabel("log2 learning rate")
            ax.set_ylabel("final loss (mlp: training set, lm: held-out text)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller models and fewer steps")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--workloads", default="mlp,lm", help="comma-separated subset of mlp,lm")
    parser.add_argument("--configs", type=int, default=16, help="random configurations for the rank correlation")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    factories = {"mlp": digits_workload, "lm": text_workload}
    results: dict = {"quick": args.quick, "workloads": {}, "spearman": {}}
    start = time.time()
    for name in args.workloads.split(","):
        work = factories[name](args.quick)
        sweeps = {p: lr_sweep(work, p == "mup") for p in ("mup", "sp")}
        results["workloads"][name] = report(work, sweeps)
        results["spearman"][name] = spearman(work, args.configs)
        print(f"[{name}] Spearman rank correlation of S=8 vs S=1 (µP) final losses over {args.configs} random "
              f"{results['spearman'][name]['optimizer']} configurations: {results['spearman'][name]['spearman']:.3f}"
              f" (target >= 0.8); elapsed {time.time() - start:.0f} s")
    results["seconds"] = time.time() - start
    (args.out / "mup_transfer.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "mup_transfer.png")
    print(f"\nwrote {args.out / 'mup_transfer.json'} and {args.out / 'mup_transfer.png'} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
