"""The shipped target's fused projections in every float32 weight layout, timed alone on this CPU.

Each layout packs the target's projections as a forward runs them (q/k/v and gate/up fused, the output
and down projections with their residual, the lm_head), in two copies read in turn, so the weights come
from where a decode reads them (memory, for a model larger than the last-level cache). For each row
count (decode batch or verify width) every layout runs the whole set of projections once per round,
the layouts' order rotating from round to round; the best round is kept. Prints ms per forward and
the ratio to `transposed` (x @ W, MKL's sgemm), and whether every layout's outputs agree.

    python -m eyas.bench layouts
    python -m eyas.bench layouts --rows 1,8,17 --rounds 30
"""

import argparse
import time

import torch

from eyas.bench.record import add_out_argument, write_record
from eyas.engine.assets import asset_path
from eyas.engine.models.fused_linear import LAYOUTS
from eyas.engine.models.layout_choice import usable_layouts
from eyas.engine.models.loader import load_model


def projections(model) -> list[tuple[object, bool]]:
    """(FusedLinear, takes a residual) in forward order."""
    order = []
    for layer in model.model.layers:
        order += [(layer.self_attn.qkv, False), (layer.self_attn.out, True), (layer.mlp.gate_up, False),
                  (layer.mlp.down, True)]
    return order + [(model.logits_proj, False)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eyas.bench layouts", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,4,8,16,64", help="rows per GEMM (comma-separated)")
    p.add_argument("--rounds", type=int, default=20)
    add_out_argument(p, "layouts")
    args = p.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    layouts = [name for name in LAYOUTS if name in usable_layouts(torch.float32, torch.device("cpu"))]
    models = {name: [load_model(asset_path("target"), dtype="float32", weight_layout=name) for _ in range(2)]
              for name in layouts}
    sets = {name: [projections(m) for m in pair] for name, pair in models.items()}
    count = len(sets[layouts[0]][0])
    megabytes = sum(p.numel() * 4 for p in load_model(asset_path("target"), weight_layout="linear").parameters()
                    if p.dim() == 2) / 1e6
    print(f"{count} fused projections, {megabytes:.0f} MB of float32 weights (embedding included), "
          f"{torch.get_num_threads()} threads; layouts: {', '.join(layouts)}")
    table = []
    with torch.inference_mode():
        for rows in rows_list:
            generator = torch.Generator().manual_seed(rows)
            inputs = {}  # made before any timing, shared by every layout: in features / ("residual", out) -> [rows, n]
            for fused, residual in sets[layouts[0]][0]:
                inputs.setdefault(fused.linears[0].in_features, torch.randn(rows, fused.linears[0].in_features,
                                                                            generator=generator))
                if residual:
                    inputs.setdefault(("residual", fused.out_features), torch.randn(rows, fused.out_features,
                                                                                    generator=generator))
            calls = {name: [[(fused, inputs[fused.linears[0].in_features],
                              inputs[("residual", fused.out_features)] if residual else None) for fused, residual in copy]
                            for copy in sets[name]] for name in layouts}
            outputs = {}

            def forward(name: str, copy: int) -> list[torch.Tensor]:
                return [fused(x, r) for fused, x, r in calls[name][copy]]

            for name in layouts:
                outputs[name] = forward(name, 0)
            best = dict.fromkeys(layouts, float("inf"))
            for round_ in range(args.rounds):
                order = layouts[round_ % len(layouts):] + layouts[:round_ % len(layouts)]
                for name in order:
                    start = time.perf_counter()
                    forward(name, round_ % 2)
                    best[name] = min(best[name], time.perf_counter() - start)
            agree = all(torch.allclose(a, b, atol=1e-3, rtol=1e-3) for name in layouts
                        for a, b in zip(outputs[name], outputs["transposed"]))
            print(f"rows {rows:3d}: " + ", ".join(f"{name} {best[name] * 1e3:.2f} ms ({best['transposed'] / best[name]:.2f}x)"
                                               for name in layouts) + ("" if agree else "  OUTPUTS DIFFER"))
            table += [{"rows": rows, "layout": name, "ms": best[name] * 1e3, "vs_transposed": best["transposed"] / best[name],
                       "outputs_agree": agree} for name in layouts]
    write_record(args.out, "layouts", argv, table, {"projections": count, "weights_mb": megabytes, "layouts": layouts})


if __name__ == "__main__":
    main()
