"""One training loop for every script: AdamW, warmup + cosine, bf16 autocast, clipping, resume, progress."""

import time
from pathlib import Path
from typing import Callable

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from training.checkpointing import load_state, save_state
from training.schedule import lr_at


def train(model: torch.nn.Module, loss_fn: Callable[[torch.Generator], torch.Tensor], cfg, state_path: Path,
          generator: torch.Generator, on_eval: Callable[[int], dict] | None = None, label: str = "train") -> dict:
    """Run `cfg.steps` steps of `loss_fn(generator)`; resumes from `state_path`. Returns a summary."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    step, extra = load_state(state_path, model, optimizer, generator)
    elapsed = extra.get("elapsed_s", 0.0)
    loss_ema = extra.get("loss_ema")
    log = extra.get("log", [])
    columns = (TextColumn(f"[bold]{label}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn())
    run_start = time.perf_counter()
    time_limit = cfg.get("time_limit_s") if hasattr(cfg, "get") else None
    with Progress(*columns) as progress:
        task = progress.add_task(label, total=cfg.steps, completed=step, loss="-")
        while step < cfg.steps:
            if time_limit and time.perf_counter() - run_start > time_limit:  # save and stop: a later run resumes
                progress.console.print(f"time limit of {time_limit} s reached at step {step}; state saved")
                if on_eval is not None:
                    log.append({"step": step, "train_loss_ema": loss_ema, **on_eval(step)})
                save_state(state_path, step, model, optimizer, generator,
                           {"elapsed_s": elapsed, "loss_ema": loss_ema, "log": log})
                break
            start = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg.lr, cfg.warmup, cfg.steps)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.bf16)):
                loss = loss_fn(generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()
            step += 1
            elapsed += time.perf_counter() - start
            value = float(loss.detach())
            loss_ema = value if loss_ema is None else 0.98 * loss_ema + 0.02 * value
            progress.update(task, completed=step, loss=f"{loss_ema:.3f}")
            if on_eval is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
                entry = {"step": step, "train_loss_ema": loss_ema, **on_eval(step)}
                log.append(entry)
                progress.console.print(entry)
            if step % cfg.save_every == 0 or step == cfg.steps:
                save_state(state_path, step, model, optimizer, generator,
                           {"elapsed_s": elapsed, "loss_ema": loss_ema, "log": log})
    return {"steps": step, "train_time_s": elapsed, "train_loss_ema": loss_ema, "log": log}
