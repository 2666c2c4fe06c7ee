"""Training curves as a PNG for a model card: the training loss and the validation agreement by depth."""

from pathlib import Path


def plot_curves(log: list[dict], path: Path, title: str) -> bool:
    """Draw `log` (the training loop's eval entries); False when matplotlib is missing (the `bench` extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no {path.name} (pip install 'eyas[bench]')")
        return False
    steps = [e["step"] for e in log]
    fig, (loss_ax, agree_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    loss_ax.plot(steps, [e["train_loss_ema"] for e in log], marker=".")
    loss_ax.set(xlabel="step", ylabel="training loss (EMA, summed over unrolled steps)", title="loss")
    depths = len(log[-1].get("top1_by_depth", []))
    for d in range(depths):
        agree_ax.plot(steps, [e["top1_by_depth"][d] for e in log], marker=".", label=f"depth {d + 1}")
    if log and "tau_estimate" in log[-1]:
        agree_ax.plot([], [], " ", label=f"tau estimate {log[-1]['tau_estimate']:.2f}")
    agree_ax.set(xlabel="step", ylabel="top-1 agreement (validation)", title="agreement with the target", ylim=(0, 1))
    agree_ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
